"""Legality-table interchange: the modded-nanogpt export has the speedrun's
forbidden-pair polarity and padded layout, and loading reads the polarity from the file's own
header, never by assumption. Also: ``legality build`` writes the prefix map beside the table,
and ``legality stats`` calls a load time a load time."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tokenmill.tokenizers import TokenizerIdentity, get_encoding
from tokenmill.tokenizers.legality import (
    BIT_FORBIDDEN,
    BIT_POSSIBLE,
    DATA_OFFSET,
    LegalityFormatError,
    LegalityTable,
    export_modded_nanogpt,
)
from tokenmill.tokenizers.prefix import PrefixMap
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks


def _small_table(n_vocab: int = 21, seed: int = 0) -> LegalityTable:
    """A random full table over a made-up vocabulary of ``n_vocab`` ids (no tokenizer)."""
    ident = TokenizerIdentity(name="toy", ranks_sha256="0" * 64, n_vocab=n_vocab,
                              eot_token=n_vocab - 1)
    bits = np.random.default_rng(seed).random((n_vocab, n_vocab)) < 0.7
    packed = np.packbits(bits, axis=1, bitorder="little")
    return LegalityTable(ident, packed, {"n_impossible": int((~bits).sum())})


def _header(path) -> dict:
    with open(path, "rb") as f:
        head = f.read(DATA_OFFSET)
    (n,) = struct.unpack("<I", head[8:12])
    return json.loads(head[12 : 12 + n])


def _rewrite_header(src, dst, change) -> None:
    data = src.read_bytes()
    header = _header(src)
    change(header)
    blob = json.dumps(header).encode()
    head = data[:8] + struct.pack("<I", len(blob)) + blob
    dst.write_bytes(head + b"\0" * (DATA_OFFSET - len(head)) + data[DATA_OFFSET:])


@pytest.mark.parametrize("n_vocab", [21, 24])
def test_export_is_forbidden_polarity_padded_and_reads_back(tmp_path, n_vocab):
    table = _small_table(n_vocab)
    out = export_modded_nanogpt(table, tmp_path / "toy.mask")
    header = _header(out)
    assert header["bit_meaning"] == BIT_FORBIDDEN and header["n_vocab"] == 128
    assert header["row_bytes"] == 16 and header["tokenizer_n_vocab"] == n_vocab
    mask = np.fromfile(out, np.uint8, offset=DATA_OFFSET).reshape(128, 128 // 8)
    bits = np.unpackbits(mask, axis=1, bitorder="little").astype(bool)
    possible = np.unpackbits(table.packed, axis=1, bitorder="little",
                             count=n_vocab).astype(bool)
    np.testing.assert_array_equal(bits[:n_vocab, :n_vocab], ~possible)
    assert not bits[n_vocab:].any() and not bits[:, n_vocab:].any()  # padding: never masked
    back = LegalityTable.load(out)
    assert not isinstance(back.packed, np.memmap)
    np.testing.assert_array_equal(back.packed, table.packed)  # padding bits stay 0
    assert back.n_impossible() == table.n_impossible()


def test_export_vocab_size_and_partial_tables_are_checked(tmp_path):
    table = _small_table()
    out = export_modded_nanogpt(table, tmp_path / "m", vocab_size=24)
    assert _header(out)["n_vocab"] == 24
    np.testing.assert_array_equal(LegalityTable.load(out).packed, table.packed)
    for bad in (20, 30):
        with pytest.raises(ValueError, match="multiple of 8"):
            export_modded_nanogpt(table, tmp_path / "x", vocab_size=bad)
    part = LegalityTable(table.identity, table.packed[:3], {}, rows=np.arange(3))
    with pytest.raises(ValueError, match="only full tables"):
        export_modded_nanogpt(part, tmp_path / "y")


def test_polarity_comes_from_the_header(tmp_path):
    table = _small_table()
    native = table.save(tmp_path / "toy.legality")
    assert _header(native)["bit_meaning"] == BIT_POSSIBLE
    np.testing.assert_array_equal(np.asarray(LegalityTable.load(native).packed), table.packed)
    # the same bytes declared forbidden read back inverted: the header decides
    flipped = tmp_path / "flipped.legality"
    _rewrite_header(native, flipped, lambda h: h.update(bit_meaning=BIT_FORBIDDEN))
    inv = LegalityTable.load(flipped)
    assert inv.n_impossible() == table.n_vocab ** 2 - table.n_impossible()
    # a header that does not say what a set bit means is refused, not guessed
    for change in (lambda h: h.pop("bit_meaning"), lambda h: h.update(bit_meaning="1 = ok")):
        silent = tmp_path / "silent.legality"
        _rewrite_header(native, silent, change)
        with pytest.raises(LegalityFormatError, match="silent.legality.*refusing to guess"):
            LegalityTable.load(silent)
    # a bare mask array (as the speedrun keeps it in memory) carries no polarity at all
    bare = tmp_path / "canon_mask.npy"
    np.save(bare, np.zeros((24, 3), np.uint8))
    with pytest.raises(LegalityFormatError, match="does not say what its bits mean"):
        LegalityTable.load(bare)


# the whole gpt2 table in the speedrun's layout (316 MB written and read back): slow, in
# `.ci/run`; the layout itself is checked on small tables above
@pytest.mark.slow
def test_gpt2_export_has_the_speedrun_layout(gpt2_table, gpt2_table_path, tmp_path, capsys):
    from tokenmill.cli import main

    enc = get_encoding("gpt2")
    out = tmp_path / "canon_mask.bin"
    assert main(["legality", "export", str(gpt2_table_path.parent), "--format",
                 "modded-nanogpt", "-o", str(out), "--encoding", "gpt2"]) == 0
    printed = capsys.readouterr().out
    assert "reshape(50304, 6288)" in printed and "forbidden" in printed
    mask = np.fromfile(out, np.uint8, offset=DATA_OFFSET).reshape(50304, 6288)

    def forbidden(a: int, b: int) -> bool:
        return bool(mask[a, b >> 3] >> (b & 7) & 1)

    hyper, eter, param = (mergeable_ranks(enc)[t] for t in (b"Hyper", b"eter", b"param"))
    assert forbidden(hyper, eter) and not forbidden(hyper, param)
    assert not mask[enc.eot_token].any()  # anything may follow <|endoftext|>
    assert not mask[enc.n_vocab:].any()  # padding rows: never masked
    cols = np.unpackbits(mask[:4096], axis=1, bitorder="little")[:, enc.n_vocab:]
    assert not cols.any()  # padding columns
    back = LegalityTable.load(out, encoding="gpt2")
    rows = np.random.default_rng(0).choice(enc.n_vocab, 300, replace=False)
    np.testing.assert_array_equal(back.packed[rows], np.asarray(gpt2_table.packed[rows]))


def test_build_writes_the_prefix_map_beside_the_table(gpt2_table_path):
    saved = gpt2_table_path.parent / "gpt2.prefix.npz"
    assert saved.exists()
    pm = PrefixMap.load(gpt2_table_path.parent, encoding="gpt2")
    np.testing.assert_array_equal(pm.parent, PrefixMap.build("gpt2").parent)
    from tokenmill.tokenizers import TokenizerMismatchError

    with pytest.raises(TokenizerMismatchError):
        PrefixMap.load(saved, encoding="cl100k_base")


def test_prefix_map_load_refuses_other_files(tmp_path):
    bad = tmp_path / "gpt2.prefix.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a saved prefix map"):
        PrefixMap.load(bad)
    with pytest.raises(FileNotFoundError):
        PrefixMap.load(tmp_path / "empty")


def test_stats_says_load_time_for_a_saved_table(gpt2_table_path, capsys):
    from tokenmill.cli import main

    assert main(["legality", "stats", "gpt2", "--table", str(gpt2_table_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("load time ") for ln in lines), lines
    built = [ln for ln in lines if ln.startswith("build time")]
    assert all("when the table was built" in ln for ln in built), built
