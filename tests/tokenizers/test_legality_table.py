"""Legality table: known pairs and their explanations, agreement with a plain-Python build of
the same definition, tightness, storage, queries and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tokenizers.rowcheck import check_rows_against_reference as _check_rows_against_reference
from tests.tokenizers.rowcheck import token_id as _id
from tokenmill.tokenizers import TokenizerMismatchError, get_encoding
from tokenmill.tokenizers.legality import (
    SPEEDRUN_GPT2_IMPOSSIBLE,
    LegalityFormatError,
    LegalityTable,
)
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks


def test_hyper_eter_impossible_hyper_param_possible(gpt2_table):
    enc = get_encoding("gpt2")
    hyper, eter, param = _id(enc, b"Hyper"), _id(enc, b"eter"), _id(enc, b"param")
    assert not gpt2_table.is_possible(hyper, eter)
    assert gpt2_table.is_possible(hyper, param)
    why = gpt2_table.explain(hyper, eter)
    assert "impossible" in why and "r + e -> re" in why and "H|ype|re|ter" in why
    why = gpt2_table.explain(hyper, param)
    assert "possible" in why and "Hyper|param" in why
    # the regex side: a newline run never ends before letters unless it is a single newline
    nn, nl, the = _id(enc, b"\n\n"), _id(enc, b"\n"), _id(enc, b"the")
    assert not gpt2_table.is_possible(nn, the) and gpt2_table.is_possible(nl, the)
    assert "'\\s' makes a lone CR/LF a piece" in gpt2_table.explain(nn, the)
    assert enc.encode_ordinary("\n\nthe") == [nl, nl, the]


def test_tightness_beats_speedrun_record(gpt2_table):
    n = gpt2_table.n_impossible()
    print(f"gpt2 impossible pairs: {n:,} (speedrun record mask: {SPEEDRUN_GPT2_IMPOSSIBLE:,})")
    assert n >= SPEEDRUN_GPT2_IMPOSSIBLE
    assert gpt2_table.meta["n_impossible"] == n


def test_gpt2_rows_match_plain_python_reference(gpt2_table):
    enc = get_encoding("gpt2")
    rng = np.random.default_rng(3)
    special = [_id(enc, b) for b in (b"e", b" ", b"\n", b"\n\n", b"    ", b"'s", b"'", b"123",
                                      b"\xe2\x80", b"\x80", b"\xa0", b"Hyper", b".\n")
               if b in mergeable_ranks(enc)]
    assert len(special) >= 11
    rows = list(rng.choice(enc.n_vocab - 1, 6, replace=False)) + special + [enc.eot_token]
    _check_rows_against_reference(gpt2_table, "gpt2", rows)


def test_partial_build_equals_full_rows(gpt2_table):
    rows = np.array([5, 1000, 38197, 50256, 12])
    part = LegalityTable.build("gpt2", rows=rows)
    for k, a in enumerate(rows):
        np.testing.assert_array_equal(part.packed[k], gpt2_table.packed[a])
    with pytest.raises(KeyError, match="not built"):
        part.is_possible(6, 7)
    with pytest.raises(ValueError, match="only full tables"):
        part.save("/tmp/never-written.legality")


def test_storage_roundtrip_and_tokenizer_mismatch(gpt2_table, gpt2_table_path, tmp_path):
    V = gpt2_table.n_vocab
    assert isinstance(gpt2_table.packed, np.memmap)
    assert gpt2_table.packed.shape == (V, (V + 7) // 8)
    assert gpt2_table_path.stat().st_size == 4096 + V * ((V + 7) // 8)
    with open(gpt2_table_path, "rb") as f:
        assert f.read(8) == b"TMLEGAL1"
    with pytest.raises(TokenizerMismatchError, match=r"gpt2@[0-9a-f]{12}.*cl100k_base@"):
        LegalityTable.load(gpt2_table_path, encoding="cl100k_base")
    bad = tmp_path / "bad.legality"
    bad.write_bytes(b"NOTMAGIC" + bytes(5000))
    with pytest.raises(LegalityFormatError, match="bad.legality"):
        LegalityTable.load(bad)
    trunc = tmp_path / "trunc.legality"
    trunc.write_bytes(gpt2_table_path.read_bytes()[: 4096 + 100])
    with pytest.raises(LegalityFormatError, match="expected"):
        LegalityTable.load(trunc)


def test_queries_agree(gpt2_table):
    enc = get_encoding("gpt2")
    prev = torch.tensor([_id(enc, b"Hyper"), enc.eot_token, 0, 220, _id(enc, b"Hyper")])
    mask = gpt2_table.mask_rows(prev)
    assert mask.dtype == torch.bool and mask.shape == (5, enc.n_vocab)
    for i, a in enumerate(prev.tolist()):
        row = gpt2_table.allowed_next(a)
        np.testing.assert_array_equal(mask[i].numpy(), row)
        for b in (0, 1, 220, 2357, 17143, enc.eot_token):
            assert row[b] == gpt2_table.is_possible(a, b)
    assert mask[1].all()  # after <|endoftext|> anything may follow
    assert not mask[0, _id(enc, b"eter")] and mask[0, _id(enc, b"param")]
    packed = gpt2_table.packed_rows(prev)
    assert packed.dtype == np.uint8 and packed.shape == (5, (enc.n_vocab + 7) // 8)
    unpacked = np.unpackbits(packed, axis=1, bitorder="little", count=enc.n_vocab)
    np.testing.assert_array_equal(unpacked.astype(bool), mask.numpy())
    # the device path (torch bit operations) gives the same bits
    from tokenmill.tokenizers.legality import unpack_rows_torch

    np.testing.assert_array_equal(
        unpack_rows_torch(torch.from_numpy(packed), enc.n_vocab).numpy(), mask.numpy())
    with pytest.raises(IndexError):
        gpt2_table.mask_rows(torch.tensor([enc.n_vocab]))


def test_cli_query_prefix_stats(gpt2_table_path, capsys):
    from tokenmill.cli import main

    folder = str(gpt2_table_path.parent)
    assert main(["legality", "query", "gpt2", "Hyper", "eter", "--table", folder]) == 0
    out = capsys.readouterr().out
    assert "impossible" in out and "r + e -> re" in out
    assert main(["legality", "query", "gpt2", "38197", "17143"]) == 0  # ids, no table
    out = capsys.readouterr().out
    assert ": possible" in out and "Hyper|param" in out
    assert main(["legality", "prefix", "gpt2", "' bananas'"]) == 0
    assert "' bananas'(35484) -> ' banana'(25996) -> ' ban'" in capsys.readouterr().out
    assert main(["legality", "stats", "gpt2", "--table", folder]) == 0
    out = capsys.readouterr().out
    assert "impossible pairs" in out and "median" in out
    # a user error: one line on stderr, exit code 2, no traceback
    assert main(["legality", "query", "gpt2", "Hyperparameter", "eter"]) == 2
    assert "not one gpt2 token" in capsys.readouterr().err
