"""Partitioned dedup decisions (tokenmill.pipeline.dedup.exact and .fuzzy) equal the
single-process oracle (tests/pipeline/dedup_oracle.py) for any partition count, and a
rerun reuses the partitions already written."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline.dedup_oracle import BlockColumns, component_roots, exact_decide, fuzzy_decide
from tokenmill.pipeline.dedup.components import components, node_partition
from tokenmill.pipeline.dedup.exact import ExactDedup
from tokenmill.pipeline.dedup.fuzzy import MinHashDedup
from tokenmill.pipeline.dedup.minhash.shingle_sets import shingle_sets, sorted_jaccard
from tokenmill.pipeline.run.intermediate import StageOutput
from tokenmill.pipeline.run.partition_files import read_partition, write_partitioned
from tokenmill.pipeline.run.removals import decide_global, load_removals
from tokenmill.pipeline.stage import Document

FUZZY = {"threshold": 0.8, "ngram": 5, "num_perm": 128, "seed": 1, "exact_check": True}


def _text(rng: random.Random, n: int = 300) -> list[str]:
    return [f"w{rng.randrange(100_000)}" for _ in range(n)]


def _edit(words: list[str], at: list[int], tag: str) -> list[str]:
    out = list(words)
    for i in at:
        out[i] = f"{tag}{i}"
    return out


def _corpus() -> list[list[Document]]:
    """Four blocks in the global order; the block order differs from the key order
    (source ``b`` comes first), with exact copies, near duplicates, a chain A~B~C (A, C
    not similar), an exact copy of a near duplicate, short and empty documents."""
    rng = random.Random(7)
    a = _text(rng)
    b = _edit(a, [20, 90, 160, 230], "x")          # J(a, b) ~ 0.87
    c = _edit(b, [50, 120, 190, 260], "y")         # J(b, c) ~ 0.87, J(a, c) ~ 0.76
    d = _text(rng)
    near_d = _edit(d, [150], "z")                  # J ~ 0.97
    far_d = _edit(d, list(range(0, 300, 12)), "v")  # J ~ 0.6: kept
    texts = {"a": a, "b": b, "c": c, "d": d, "near_d": near_d, "far_d": far_d}
    texts = {k: " ".join(v) for k, v in texts.items()}
    plan = [  # (source, [(name or literal text)])
        ("b", ["near_d", "b", "lit:short text", "d"]),
        ("b", ["b", "c", "lit:", "lit:short text"]),
        ("a", ["a", "far_d", "near_d", "d"] + [f"uniq{i}" for i in range(6)]),
        ("a", ["c", "lit:one two", "a"] + [f"uniq{i}" for i in range(6, 12)]),
    ]
    blocks, row = [], {"a": 0, "b": 0}
    for src, names in plan:
        docs = []
        for name in names:
            if name.startswith("lit:"):
                text = name[4:]
            elif name.startswith("uniq"):
                text = " ".join(_text(rng, 80))
            else:
                text = texts[name]
            docs.append(Document(key=f"{src}/f.jsonl#{row[src]:06d}", source=src, text=text))
            row[src] += 1
        blocks.append(docs)
    return blocks


def _write_blocks(work: Path, blocks: list[list[Document]], fuzzy: dict) -> list[str]:
    stages = [ExactDedup(), MinHashDedup(**fuzzy)]
    digests = []
    for i, docs in enumerate(blocks):
        cols = {"key": pa.array([d.key for d in docs], pa.string()),
                "text": pa.array([d.text for d in docs], pa.large_string())}
        for st in stages:
            cols.update(st.block_columns(docs))
        out = StageOutput(work, "prepare", f"block{i:04d}")
        out.dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), out.path(".docs.parquet"))
        digests.append(out.digest)
    return digests


def _reference(work: Path, digests: list[str], fuzzy: dict):
    """Today's single-process decision (the driver's dicts)."""
    def read(i, cols):
        path = StageOutput(work, "prepare", digests[i]).path(".docs.parquet")
        return pq.read_table(path, columns=list(dict.fromkeys(["key", *cols])))
    view = BlockColumns(len(digests), read)
    removals = [{} for _ in digests]
    exact_decide(view, removals)
    record = fuzzy_decide(fuzzy, view, removals)
    return removals, record


def _partitioned(work: Path, digests: list[str], fuzzy: dict, parts: int):
    per_block, records = decide_global(
        str(work), digests, [ExactDedup(), MinHashDedup(**fuzzy)], parts)
    removals = [load_removals(str(work / "dedup"), b["removals"]) for b in per_block]
    assert [b["removed"] for b in per_block] == [len(r) for r in removals]
    return removals, records["fuzzy_dedup"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    work = tmp_path_factory.mktemp("dedup") / "work"
    blocks = _corpus()
    digests = _write_blocks(work, blocks, FUZZY)
    return work, blocks, digests, _reference(work, digests, FUZZY)


def test_reference_has_the_planted_cases(planted):
    """The planted corpus exercises what the partitioned decision must reproduce."""
    _, blocks, _, (removals, record) = planted
    flat = {k: v for d in removals for k, v in d.items()}
    key = {(i, j): d.key for i, docs in enumerate(blocks) for j, d in enumerate(docs)}
    a, c_a, b1 = key[2, 0], key[3, 0], key[0, 1]
    # chain: b (block 0, the first of its text in the global order, but a's key is lower)
    # is removed for a; c is kept (J(a, c) < 0.8) and c's later copies point to c
    assert flat[b1][:2] == [a, "fuzzy_dedup"]
    assert key[1, 1] not in flat and flat[c_a] == [key[1, 1], "exact_dedup", None]
    # an exact copy of the removed b points to a, "same text as" b
    assert flat[key[1, 0]] == [a, "exact_dedup", f"same text as {b1}"]
    ss, off = shingle_sets([blocks[2][0].text, blocks[1][1].text])
    assert sorted_jaccard(ss[off[0]:off[1]], ss[off[1]:off[2]]) < 0.8
    assert key[2, 1] not in flat  # far_d (J ~ 0.6) kept
    assert flat[key[1, 3]] == [key[0, 2], "exact_dedup", None]  # first in block order
    assert record["counters"]["removed"] >= 2


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_partitioned_equals_reference(planted, parts):
    work, _, digests, (ref_removals, ref_record) = planted
    removals, record = _partitioned(work, digests, FUZZY, parts)
    assert removals == ref_removals
    assert record == ref_record


def test_estimate_only_equals_reference(tmp_path):
    fuzzy = FUZZY | {"exact_check": False}
    digests = _write_blocks(tmp_path, _corpus(), fuzzy)
    ref_removals, ref_record = _reference(tmp_path, digests, fuzzy)
    removals, record = _partitioned(tmp_path, digests, fuzzy, 3)
    assert (removals, record) == (ref_removals, ref_record)


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_rerun_reuses_written_partitions(tmp_path):
    """An abandoned run (some partitions' outputs missing, one torn) is resumed: the
    missing and torn ones are recomputed, every other file is reused untouched, and the
    result is the same."""
    digests = _write_blocks(tmp_path, _corpus(), FUZZY)
    first = _partitioned(tmp_path, digests, FUZZY, 3)
    dedup = tmp_path / "dedup"
    before = _files(dedup)
    gone = sorted((dedup / "fuzzy_verify").glob("*.done.json"))[0]
    gone.unlink()  # that partition was not committed
    (dedup / "removals").joinpath(
        sorted(p.name for p in (dedup / "removals").glob("*.parquet"))[0]).write_bytes(b"x")
    second = _partitioned(tmp_path, digests, FUZZY, 3)
    assert second == first
    after = _files(dedup)
    changed = {k for k in before if k in after and before[k] != after[k]}
    assert gone.name.replace(".done.json", ".arrow") in {Path(k).name for k in changed}
    assert any(k.startswith("removals/") and k.endswith(".parquet") for k in changed)
    assert len(changed) <= 5  # the two outputs (removals: two files) and their done records
    assert set(after) == set(before)


@pytest.mark.parametrize("exact_check", [True, False])
def test_no_blocks_gives_the_record_of_no_documents(tmp_path, exact_check):
    """A datamix whose files yield no document: nothing removed, and the fuzzy record
    equals the oracle's over no documents (no Ray task needed)."""
    fuzzy = FUZZY | {"exact_check": exact_check}
    per_block, records = decide_global(str(tmp_path), [], [ExactDedup(), MinHashDedup(**fuzzy)],
                                       3)
    assert per_block == []
    assert records == {"fuzzy_dedup": fuzzy_decide(fuzzy, BlockColumns(0, None), [])}


def test_partitions_is_not_part_of_the_config_hash():
    from tokenmill.pipeline.config import DatamixConfig

    base = {"name": "x", "sources": [{"name": "s", "path": "p"}]}
    one = DatamixConfig.model_validate(base)
    many = DatamixConfig.model_validate(base | {"dedup": {"partitions": 64}})
    assert many.dedup.partitions == 64 and one.sha256() == many.sha256()
    with pytest.raises(ValueError):
        DatamixConfig.model_validate(base | {"dedup": {"partitions": 0}})


def _graph(seed: int) -> np.ndarray:
    """Candidate edges ``(head, member)``, head < member, ids ``block << 32 | row`` over 4
    blocks: random sparse edges, a long path in shuffled id order, a star, a clique."""
    rng = np.random.default_rng(seed)
    ids = np.unique((rng.integers(0, 4, 900) << 32) | rng.integers(0, 5000, 900))
    rng.shuffle(ids)
    parts = [rng.choice(ids[:300], size=(150, 2))]
    path = ids[300:500]
    parts.append(np.stack([path[:-1], path[1:]], 1))
    parts.append(np.stack([np.full(60, ids[500]), ids[501:561]], 1))
    clique = ids[561:575]
    parts.append(np.array([(a, b) for a in clique for b in clique if a != b]))
    e = np.concatenate(parts)
    e = np.sort(e[e[:, 0] != e[:, 1]], axis=1)
    return np.unique(e, axis=0)


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_distributed_components_equal_union_find(tmp_path, parts):
    """Large-star/small-star components (labels: smallest id) equal union-find's."""
    e = _graph(parts)
    work = str(tmp_path)
    out = StageOutput(work, "fuzzy_buckets", "g")
    write_partitioned(out.path(".arrow"), pa.table({"head": e[:, 0], "member": e[:, 1]}),
                      node_partition(e[:, 1], parts), parts)
    final, info = components(work, parts, ["g"], 4, False)
    got = pa.concat_tables(read_partition(StageOutput(work, "cc_final", d)
                                          .path(".members.arrow")) for d in final)
    labels = dict(zip(got.column("id").to_pylist(), got.column("label").to_pylist(),
                      strict=True))
    nodes, inv = np.unique(e.ravel(), return_inverse=True)
    want = nodes[component_roots(len(nodes), inv.reshape(-1, 2))]
    assert labels == dict(zip(nodes.tolist(), want.tolist(), strict=True))
    assert info["candidate_pairs"] == len(e)
    assert info["candidate_clusters"] == len(np.unique(want))
    assert info["rounds"] < 30
    edges = pa.concat_tables(read_partition(StageOutput(work, "cc_final", d)
                                            .path(".edges.arrow")) for d in final)
    assert sorted(zip(edges.column("head").to_pylist(), edges.column("member").to_pylist(),
                      strict=True)) == sorted(map(tuple, e.tolist()))
