"""tokenmill.train.data: the datamix loader over real shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.manifests.mixdata import cached_test_curations, write_spec
from tests.shared import corpora
from tokenmill.manifests.mix import build_mix
from tokenmill.manifests.shards import read_tokens
from tokenmill.train.data import MixLoader

EOT = 50256
T, B = 64, 8
WEIGHTS = {"c4": 0.5, "wiki": 0.3, "py": 0.2}
SOURCES = {
    "c4": {"source": "c4-en-sample", "weight": 0.5, "max_epochs": 20},
    "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.3, "max_epochs": 20},
    "py": {"source": "python-docs-rst", "weight": 0.2, "max_epochs": 20},
}


@pytest.fixture(scope="module")
def cur() -> dict[str, Path]:
    return cached_test_curations(corpora("c4-en-sample").parent)


@pytest.fixture(scope="module")
def mix(cur, tmp_path_factory) -> Path:
    """0.5/0.3/0.2 over three real sources, budget for 10,000 steps of 8 x 64."""
    tmp = tmp_path_factory.mktemp("mix")
    spec = write_spec(tmp / "mix.yaml", [cur["web"], cur["ref"]], SOURCES,
                      10_000 * B * (T + 1))
    build_mix(spec, tmp / "mix.json")
    return tmp / "mix.json"


def _take(loader: MixLoader, n: int) -> list[dict]:
    return [loader.next_batch() for _ in range(n)]


def _same(a: dict, b: dict) -> None:
    for k in ("inputs", "targets", "cu_seqlens", "sources"):
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    assert a["step"] == b["step"]


def test_mixture_shares_over_10000_steps(mix):
    loader = MixLoader(mix, seq_len=T, batch_size=B, provenance=True)
    assert loader.num_steps == 10_000
    names = loader.source_names
    # which source owns each shard, from the manifest itself
    m = json.loads(mix.read_text())
    owner = {str((mix.parent / sh["path"]).resolve()): s["name"]
             for s in m["sources"] for sh in s["shards"]}
    shard_owner = np.array([names.index(owner[p]) for p in loader.shard_paths])
    counts = np.zeros(len(names), np.int64)
    for batch in loader:
        src = batch["sources"].astype(np.int64)
        counts += np.bincount(src, minlength=len(names)) * T
        pieces = batch["pieces"]
        # every piece of a row is read from a shard of the row's source
        assert (shard_owner[pieces[:, 1]] == src[pieces[:, 0]]).all()
    share = counts / counts.sum()
    for i, n in enumerate(names):
        assert abs(share[i] - WEIGHTS[n]) <= 0.005 * WEIGHTS[n], (n, share[i])


def test_short_source_repeats_up_to_max_epochs(cur, tmp_path):
    sources = {k: dict(v) for k, v in SOURCES.items()}
    sources["wiki"]["max_epochs"] = 3
    spec = write_spec(tmp_path / "mix.yaml", [cur["web"], cur["ref"]], sources, 7_000_000)
    m = build_mix(spec, tmp_path / "mix.json")
    wiki = next(s for s in m.sources if s.name == "wiki")
    assert wiki.epochs == pytest.approx(3.0) and wiki.shortfall_tokens > 0
    assert any("'wiki'" in w and f"shortfall {wiki.shortfall_tokens:,}" in w for w in m.warnings)
    loader = MixLoader(tmp_path / "mix.json", seq_len=T, batch_size=B)
    summary = {s["source"]: s for s in loader.summary()}
    # the short source is read about 3 times, never past its grant by more than a row
    assert 2.9 < summary["wiki"]["passes"] <= 3.0 + (T + 1) / wiki.available_tokens
    assert summary["wiki"]["tokens_read"] <= wiki.granted_tokens + T + 1
    share = summary["wiki"]["share"]
    assert share == pytest.approx(wiki.effective_weight, rel=0.005)


def test_two_ranks_are_disjoint_and_union_is_single_rank_stream(mix):
    n = 40
    single = _take(MixLoader(mix, seq_len=T, batch_size=B, provenance=True), n)
    ranks = [_take(MixLoader(mix, seq_len=T, batch_size=B, world_size=2, rank=r,
                             provenance=True), n) for r in (0, 1)]
    for s in range(n):
        a, b = ranks[0][s], ranks[1][s]
        assert a["inputs"].shape == b["inputs"].shape == (B // 2, T)
        np.testing.assert_array_equal(np.concatenate([a["inputs"], b["inputs"]]),
                                      single[s]["inputs"])
        np.testing.assert_array_equal(np.concatenate([a["targets"], b["targets"]]),
                                      single[s]["targets"])
        # disjoint: no shard token is read by both ranks in a step
        def positions(batch):
            return {(int(p[1]), t) for p in batch["pieces"] for t in range(p[2], p[2] + p[3])}
        assert not positions(a) & positions(b)


def test_resume_at_step_37_gives_the_same_next_50_batches(mix):
    full = _take(MixLoader(mix, seq_len=T, batch_size=B), 87)
    first = MixLoader(mix, seq_len=T, batch_size=B)
    _take(first, 37)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["step"] == 37
    resumed = MixLoader(mix, seq_len=T, batch_size=B, state=state)
    for s, batch in enumerate(_take(resumed, 50)):
        _same(batch, full[37 + s])
    # the same state resumes a 2-rank run: rank 1 gets the second half of each batch
    r1 = MixLoader(mix, seq_len=T, batch_size=B, world_size=2, rank=1, state=state)
    for s, batch in enumerate(_take(r1, 5)):
        np.testing.assert_array_equal(batch["inputs"], full[37 + s]["inputs"][B // 2:])
    with pytest.raises(ValueError, match="seq_len"):
        MixLoader(mix, seq_len=T + 1, batch_size=B, state=state)


@pytest.mark.parametrize("remainder", ["carry", "drop"])
def test_rows_start_with_bos_and_stay_inside_the_ranges(cur, tmp_path, remainder):
    # python-docs gets < 1 epoch, so its ranges are prefixes of its shards
    sources = {"c4": {"source": "c4-en-sample", "weight": 0.5},
               "py": {"source": "python-docs-rst", "weight": 0.5}}
    spec = write_spec(tmp_path / "mix.yaml", [cur["web"], cur["ref"]], sources, 600_000)
    m = build_mix(spec, tmp_path / "mix.json")
    assert next(s for s in m.sources if s.name == "py").epochs < 1
    ranges = {str((tmp_path / sh.path).resolve()): (sh.start, sh.end)
              for s in m.sources for sh in s.shards}
    T2 = 256
    loader = MixLoader(tmp_path / "mix.json", seq_len=T2, batch_size=4, remainder=remainder,
                       provenance=True)
    tokens = [np.asarray(read_tokens(p)) for p in loader.shard_paths]
    assert loader.num_steps > 100
    for batch in loader:
        x, y, cu = batch["inputs"], batch["targets"], batch["cu_seqlens"]
        assert (x[:, 0] == EOT).all()
        assert (x.reshape(-1)[cu[:-1]] == EOT).all()  # every varlen segment starts with BOS
        assert cu[0] == 0 and cu[-1] == x.size and (np.diff(cu) > 0).all()
        assert batch["max_seqlen"] == int(np.diff(cu).max())
        # rebuild each row independently from its pieces
        rows = [[] for _ in range(x.shape[0])]
        for r, j, off, n, bos in batch["pieces"].tolist():
            lo, hi = ranges[loader.shard_paths[j]]
            assert lo <= off and off + n <= hi, "read outside the manifest's range"
            rows[r] += ([EOT] if bos else []) + tokens[j][off:off + n].tolist()
        full = np.array(rows)
        np.testing.assert_array_equal(x, full[:, :-1])
        np.testing.assert_array_equal(y, full[:, 1:])
        p = batch["pieces"]
        row_first = np.r_[True, p[1:, 0] != p[:-1, 0]]
        assert not p[~row_first, 4].any()  # a prepended BOS only ever opens a row
        if remainder == "drop":  # only documents longer than a row are continued
            docs = loader.documents
            for _, j, off, _, _ in p[p[:, 4] == 1].tolist():
                d = np.flatnonzero((docs.doc_shard == j) & (docs.doc_off < off)
                                   & (docs.doc_off + docs.doc_len > off))
                assert len(d) == 1 and docs.doc_len[d[0]] > T2 + 1


def test_drop_mode_reads_whole_document_heads_only(cur, tmp_path):
    sources = {"c4": {"source": "c4-en-sample", "weight": 1.0}}
    spec = write_spec(tmp_path / "mix.yaml", [cur["web"]], sources, 200_000)
    build_mix(spec, tmp_path / "mix.json")
    loader = MixLoader(tmp_path / "mix.json", seq_len=128, batch_size=4, remainder="drop",
                       provenance=True)
    docs = loader.documents
    starts = set(zip(docs.doc_shard.tolist(), docs.doc_off.tolist(), strict=True))
    for batch in _take(loader, 50):
        for _, j, off, _, bos in batch["pieces"].tolist():
            if not bos:
                assert (j, off) in starts  # never a dropped tail
    carry = MixLoader(tmp_path / "mix.json", seq_len=128, batch_size=4, provenance=True)
    read = sum(int(b["pieces"][:, 3].sum()) for b in _take(carry, 50))
    docs_read = carry.state_dict()["cursors"][0]["position"]
    assert docs_read < loader.state_dict()["cursors"][0]["position"]  # drop uses up more
    assert read > 0


def test_torch_output_and_int32(mix):
    import torch

    a = MixLoader(mix, seq_len=T, batch_size=B, output="torch", pin_memory=True,
                  dtype=np.int32).next_batch()
    b = MixLoader(mix, seq_len=T, batch_size=B).next_batch()
    assert isinstance(a["inputs"], torch.Tensor) and a["inputs"].dtype == torch.int32
    assert a["targets"].dtype == torch.int32 and isinstance(a["cu_seqlens"], torch.Tensor)
    assert b["inputs"].dtype == np.int64
    np.testing.assert_array_equal(a["inputs"].numpy(), b["inputs"])
    np.testing.assert_array_equal(a["targets"].numpy(), b["targets"])
    np.testing.assert_array_equal(a["cu_seqlens"].numpy(), b["cu_seqlens"])


def test_val_split_is_one_ordered_pass(mix):
    val = MixLoader(mix, seq_len=T, batch_size=2, split="val", provenance=True)
    assert val.num_steps > 10 and val.source_names == ["val"]
    batches = list(val)
    assert len(batches) == val.num_steps
    first = batches[0]["pieces"][0]
    assert first[2] == 0 and first[1] == 0  # starts at the first val document, in order
    for b in batches:
        assert (b["inputs"][:, 0] == EOT).all()
    again = list(MixLoader(mix, seq_len=T, batch_size=2, split="val"))
    for a, b in zip(batches, again, strict=True):
        _same(a, b)


def test_bad_configurations(mix):
    with pytest.raises(ValueError, match="multiple of world_size"):
        MixLoader(mix, seq_len=T, batch_size=6, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        MixLoader(mix, seq_len=T, batch_size=8, world_size=2, rank=2)
    loader = MixLoader(mix, seq_len=T, batch_size=B, max_steps=3)
    assert len(list(loader)) == 3
    with pytest.raises(StopIteration):
        loader.next_batch()


def test_weight_schedule_is_followed_by_step(cur, tmp_path):
    tokens_per_step = B * (T + 1)
    spec = write_spec(
        tmp_path / "mix.yaml", [cur["web"], cur["ref"]], SOURCES, 2000 * tokens_per_step,
        schedule={"unit": "steps", "tokens_per_step": tokens_per_step,
                  "points": [{"at": 1000, "weights": {"c4": 0.1, "wiki": 0.1, "py": 0.8}}]})
    build_mix(spec, tmp_path / "mix.json")
    loader = MixLoader(tmp_path / "mix.json", seq_len=T, batch_size=B)
    assert loader.num_steps == 2000
    counts = np.zeros((2, 3))
    for batch in loader:
        counts[batch["step"] // 1000] += np.bincount(batch["sources"], minlength=3)
    names = loader.source_names
    want = [WEIGHTS, {"c4": 0.1, "wiki": 0.1, "py": 0.8}]
    for half in (0, 1):
        share = counts[half] / counts[half].sum()
        for i, n in enumerate(names):
            assert share[i] == pytest.approx(want[half][n], abs=2 / counts[half].sum())


def test_from_curation_is_one_document_aligned_pass(cur):
    """A curation manifest through the same loader: every source at its mixture weight,
    one pass, no document read twice, rows document-aligned."""
    loader = MixLoader.from_curation(cur["ref"], seq_len=T, batch_size=B, seed=3,
                                     provenance=True)
    m = loader.manifest
    assert m.kind == "training-mix" and [s.name for s in m.sources] == loader.source_names
    assert all(s.epochs <= 1.0 for s in m.sources) and loader.num_steps > 100
    starts = set()
    for batch in loader:
        assert (batch["inputs"][:, 0] == EOT).all()
        for _, j, off, _, bos in batch["pieces"].tolist():
            if not bos:
                assert (j, off) not in starts, "a document was read twice"
                starts.add((j, off))
    for s in loader.summary():
        assert s["passes"] <= 1.0
    # weights 1:1 over a budget of all train tokens: the smaller source is read whole
    # (short of its half), the larger one for its half, a document-aligned prefix
    small, big = sorted(m.sources, key=lambda s: s.available_tokens)
    half = (small.available_tokens + big.available_tokens) / 2
    assert small.epochs == pytest.approx(1.0) and small.shortfall_tokens > 0
    assert abs(big.granted_tokens - half) <= 1 and big.epochs < 1.0
    # same seed, same batches; the val split and more epochs through the same code
    again = MixLoader.from_curation(cur["ref"].parent, seq_len=T, batch_size=B, seed=3)
    _same(again.next_batch(), MixLoader.from_curation(cur["ref"], seq_len=T, batch_size=B,
                                                      seed=3).next_batch())
    val = MixLoader.from_curation(cur["ref"], seq_len=T, batch_size=2, split="val")
    assert val.source_names == ["val"] and val.num_steps > 0
    two = MixLoader.from_curation(cur["ref"], seq_len=T, batch_size=B, seed=3, epochs=2)
    assert abs(two.num_steps - 2 * loader.num_steps) <= 1
