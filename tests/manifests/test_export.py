"""`tokenmill shards export --format modded-nanogpt`, read back the way modded-nanogpt reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.manifests.mixdata import cached_test_curations, write_spec
from tests.shared import corpora
from tokenmill.manifests.export import DEFAULT_SEQ_LEN, export_modded_nanogpt
from tokenmill.manifests.mix import build_mix
from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import iter_documents
from tokenmill.train.data import MixLoader

BOS_ID = 50256


# --- modded-nanogpt (train_gpt.py), kept as there, minus CUDA -----------------------------
def _load_data_shard(file: Path):
    header = torch.from_file(str(file), False, 256, dtype=torch.int32)  # header is 256 int32
    assert header[0] == 20240520, "magic number mismatch in the data .bin file"
    assert header[1] == 1, "unsupported version"
    num_tokens = int(header[2])  # number of tokens (claimed)
    with file.open("rb", buffering=0) as f:
        tokens = torch.empty(num_tokens, dtype=torch.uint16,
                             pin_memory=torch.cuda.is_available())
        f.seek(256 * 4)
        nbytes = f.readinto(tokens.numpy())  # avoid bytes->array copy by @YouJiacheng
        assert nbytes == 2 * num_tokens, "number of tokens read does not match header"
    return tokens


class BOSFinder:
    # Helper for getting sequences that start at the beginning of documents
    def __init__(self, tokens: torch.Tensor, world_size: int = 1):
        self.tokens = tokens
        self.size = tokens.numel()
        self.bos_idx = (tokens == BOS_ID).nonzero(as_tuple=True)[0].to(torch.int64).numpy()
        self.i = 0
        self.world_size = world_size

    def next_batch(self, num_tokens_local: int, max_seq_len: int):
        n = len(self.bos_idx)
        starts = [[] for _ in range(self.world_size)]
        ends = [[] for _ in range(self.world_size)]
        idx = self.i
        for r in range(self.world_size):
            cur_len = 0
            while cur_len <= num_tokens_local:
                if idx >= n:
                    raise StopIteration("Insufficient BOS ahead; hit tail of shard.")
                cur = self.bos_idx[idx]
                starts[r].append(cur)
                end = min(self.bos_idx[idx + 1] if idx + 1 < n else self.size,
                          cur + max_seq_len,
                          cur + num_tokens_local - cur_len + 1)
                ends[r].append(end)
                cur_len += end - cur
                idx += 1
            assert cur_len == num_tokens_local + 1
        self.i = idx
        return starts, ends
# -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cur() -> dict[str, Path]:
    return cached_test_curations(corpora("c4-en-sample").parent)


@pytest.fixture(scope="module")
def exported(cur, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    sources = {
        "c4": {"source": "c4-en-sample", "weight": 0.5, "max_epochs": 3},
        "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.3, "max_epochs": 3},
        "py": {"source": "python-docs-rst", "weight": 0.2, "max_epochs": 3},
    }
    spec = write_spec(tmp / "mix.yaml", [cur["web"], cur["ref"]], sources, 1_500_000)
    m = build_mix(spec, tmp / "mix.json")
    summary = export_modded_nanogpt(tmp / "mix.json", tmp / "out", shard_tokens=400_000,
                                    log=lambda s: None)
    return tmp, m, summary


def test_modded_nanogpt_reads_the_export(exported, cur):
    tmp, m, summary = exported
    out = tmp / "out"
    train = sorted(out.glob("fineweb_train_*.bin"))
    val = sorted(out.glob("fineweb_val_*.bin"))
    assert train[0].name == "fineweb_train_000001.bin" and len(train) >= 3
    assert val[0].name == "fineweb_val_000000.bin"
    # modded-nanogpt's BOS-aligned batching over every train shard: 8 ranks x 2048 tokens
    n_batches = 0
    for f in train + val:
        tokens = _load_data_shard(f)
        assert tokens[0] == BOS_ID
        finder = BOSFinder(tokens, world_size=8)
        while True:
            try:
                starts, ends = finder.next_batch(2048, max_seq_len=512)
            except StopIteration:
                break
            for r in range(8):
                buf = torch.cat([tokens[a:b] for a, b in zip(starts[r], ends[r], strict=True)])
                assert buf.numel() == 2049
                assert all(tokens[a] == BOS_ID for a in starts[r])
            n_batches += 1
    assert n_batches >= 20
    # the train stream is the loader's whole budget of rows; each source within two rows
    # of its granted tokens; the files are the listed ones
    row = DEFAULT_SEQ_LEN + 1
    train_tokens = sum(f["tokens"] for f in summary["files"]
                       if f["split"] == "train" and "role" not in f)
    assert train_tokens == (m.total_tokens // row) * row
    for s in m.sources:
        assert abs(summary["sources"][s.name]["tokens"] - s.granted_tokens) <= 2 * row
    listed = json.loads((out / "export.json").read_text())
    assert {f["path"] for f in listed["files"] if "role" not in f} == {
        p.name for p in train + val}
    assert {f["path"] for f in listed["files"] if f.get("role") == "sidecar"} == {
        p.name[:-4] + ".docs.parquet" for p in train + val}


def test_exported_documents_are_the_curated_ones_in_mixed_order(exported, cur):
    tmp, m, _ = exported
    out = tmp / "out"
    originals = {}
    for man in (cur["web"], cur["ref"]):
        for sh in load_manifest(man).shards():
            for key, toks in iter_documents(man.parent / sh.path):
                originals[key] = np.asarray(toks)
    tokens_by_source = {s.name: 0 for s in m.sources}
    seen_prefix = []
    n_tails = 0
    for f in sorted(out.glob("fineweb_train_*.bin")):
        toks = _load_data_shard(f).numpy()
        side = pq.read_table(f.with_name(f.name[:-4] + ".docs.parquet")).to_pydict()
        for off, n, key, src, at in zip(side["offset"], side["n_tokens"], side["key"],
                                        side["source"], side["doc_offset"], strict=True):
            doc = toks[off:off + n]
            orig = originals[key]
            assert doc[0] == BOS_ID
            if at == 0:  # a whole document or the head of one cut at a row's end
                np.testing.assert_array_equal(doc, orig[:n])
            else:  # the tail of a cut document, EOT prepended
                np.testing.assert_array_equal(doc[1:], orig[at:at + n - 1])
                n_tails += 1
            tokens_by_source[src] += int(n)
            seen_prefix.append((src, int(n)))
    assert n_tails > 0
    total = sum(tokens_by_source.values())
    for s in m.sources:
        assert abs(tokens_by_source[s.name] - s.granted_tokens) <= 2 * (DEFAULT_SEQ_LEN + 1)
    # the mixture holds along the stream, not only at its end: check the first half
    half, acc = total // 2, {s.name: 0 for s in m.sources}
    pos = 0
    for src, n in seen_prefix:
        if pos >= half:
            break
        acc[src] += n
        pos += n
    longest = 2 * (DEFAULT_SEQ_LEN + 1)  # SWRR: each source within a row or two
    for s in m.sources:
        assert abs(acc[s.name] - s.effective_weight * pos) <= longest


def test_export_is_deterministic_and_refuses_wide_vocabularies(exported, cur, tmp_path):
    tmp, _, _ = exported
    export_modded_nanogpt(tmp / "mix.json", tmp_path / "again", shard_tokens=400_000,
                          log=lambda s: None)
    for f in sorted((tmp / "out").iterdir()):
        assert (tmp_path / "again" / f.name).read_bytes() == f.read_bytes(), f.name
    spec = write_spec(tmp_path / "w.yaml", [cur["wiki100k"]],
                      {"wiki": {"source": "wikipedia-wikitext-sample", "weight": 1.0}}, 10_000)
    build_mix(spec, tmp_path / "w.json")
    with pytest.raises(ValueError, match="uint16"):
        export_modded_nanogpt(tmp_path / "w.json", tmp_path / "w-out")


def test_cli_export(exported, tmp_path, capsys):
    from tokenmill.cli import main

    tmp, m, _ = exported
    rc = main(["shards", "export", str(tmp / "mix.json"), "--format", "modded-nanogpt", "-o",
               str(tmp_path / "cli"), "--splits", "train"])
    assert rc == 0
    assert not list((tmp_path / "cli").glob("fineweb_val_*"))
    assert (tmp_path / "cli" / "fineweb_train_000001.bin").exists()
    assert "c4" in capsys.readouterr().out


def _stream(folder: Path) -> np.ndarray:
    return np.concatenate([_load_data_shard(f).numpy()
                           for f in sorted(folder.glob("fineweb_train_*.bin"))])


def _loader_stream(loader: MixLoader) -> np.ndarray:
    rows = [np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1).reshape(-1)
            for b in loader]
    return np.concatenate(rows).astype(np.uint16)


def test_export_holds_exactly_the_loader_stream(exported):
    """Default export (seq_len 2048, one row per step) == MixLoader's stream."""
    tmp, _, _ = exported
    loader = MixLoader(tmp / "mix.json", seq_len=DEFAULT_SEQ_LEN, batch_size=1)
    np.testing.assert_array_equal(_stream(tmp / "out"), _loader_stream(loader))


@pytest.mark.parametrize("remainder", ["carry", "drop"])
def test_export_follows_the_loader_for_other_batches(exported, tmp_path, remainder):
    """Shuffled rows within a step (batch 4) and both remainder modes, across shards."""
    tmp, _, _ = exported
    export_modded_nanogpt(tmp / "mix.json", tmp_path, shard_tokens=300_000, splits=("train",),
                          seq_len=128, batch_size=4, remainder=remainder, log=lambda s: None)
    loader = MixLoader(tmp / "mix.json", seq_len=128, batch_size=4, remainder=remainder)
    np.testing.assert_array_equal(_stream(tmp_path), _loader_stream(loader))
    assert json.loads((tmp_path / "export.json").read_text())["loader"] == {
        "seq_len": 128, "batch_size": 4, "remainder": remainder, "verified": True}


def test_export_names_the_mix_identity_not_its_side_channel_listing(exported, tmp_path):
    """Listing a side channel in the mix manifest changes its bytes, not its identity:
    the export records the identity, so it is the same before and after."""
    import json

    from tokenmill.manifests.export import export_modded_nanogpt
    from tokenmill.manifests.mixschema import (
        SideChannelRef,
        mix_identity_sha256,
        register_side_channel,
    )

    tmp, _, _ = exported
    mix = tmp / "mix-listed.json"  # beside the original: its relative paths still hold
    mix.write_bytes((tmp / "mix.json").read_bytes())
    ident = mix_identity_sha256(mix)
    register_side_channel(mix, SideChannelRef(kind="lem-side-channel", split="train",
                                              path="lem/lem.json", sha256="0" * 64, files=[]))
    assert mix_identity_sha256(mix) == ident
    export_modded_nanogpt(mix, tmp_path / "out", splits=("train",), log=lambda s: None)
    meta = json.loads((tmp_path / "out" / "export.json").read_text())
    assert meta["mix_manifest_sha256"] == ident
