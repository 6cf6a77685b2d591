"""A new stage is a class and one line in the stage list. Two stages that exist only in
this test, a document filter and a global dedup-like stage, are added to the list (and
nowhere else) and run through ``tokenmill run``: the executor runs them, the manifest
counts and records them, the summary and the report show them."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenmill import cli
from tokenmill.pipeline.run import stage_list
from tokenmill.pipeline.run.intermediate import StageOutput, content_hash
from tokenmill.pipeline.run.partition_files import cached, write_partitioned
from tokenmill.pipeline.run.prepare_task import read_block_columns
from tokenmill.pipeline.run.removals import REMOVALS, Shuffle, removal_file
from tokenmill.pipeline.run.stage_list import StageDef
from tokenmill.pipeline.run.tasks import run_batches
from tokenmill.pipeline.stage import (
    Document,
    DocumentFilter,
    GlobalContext,
    GlobalDecision,
    GlobalStage,
)

MARK = "ZZMARK"


class DropMarked(DocumentFilter):
    """Removes the documents that contain a marker."""

    name = "drop_marked"

    def __init__(self, marker: str = MARK) -> None:
        super().__init__(marker=marker)
        self.marker = marker

    def reason(self, doc: Document) -> str | None:
        return "drop_marked:marker" if self.marker in doc.text else None


@dataclass(frozen=True)
class PrefixTask:
    run: Shuffle
    blocks: tuple[str, ...]
    stage: str
    digest: str


def same_prefix(task: PrefixTask) -> dict[str, Any]:
    """One task over all blocks: of the documents sharing their first 30 characters, the
    first in the global order is kept."""
    run = task.run
    out = StageOutput(run.work, "same_prefix", task.digest)

    def compute() -> dict[str, Any]:
        first: dict[str, str] = {}
        rows: list[tuple[int, int, str, str]] = []
        for i, digest in enumerate(task.blocks):
            t = read_block_columns(run.prepare_work, digest, ["key", "prefix"])
            gone = set(run.removed_rows(i).tolist())
            for r, (key, prefix) in enumerate(zip(t.column("key").to_pylist(),
                                                  t.column("prefix").to_pylist(), strict=True)):
                kept = first.setdefault(prefix, key) if r not in gone else key
                if kept != key:
                    rows.append((i, r, key, kept))
        block = np.array([x[0] for x in rows], np.int64)
        table = pa.table({"block": pa.array(block, pa.int32()),
                          "row": pa.array([x[1] for x in rows], pa.int32()),
                          "key": [x[2] for x in rows], "kept": [x[3] for x in rows],
                          "stage": [task.stage] * len(rows),
                          "detail": pa.nulls(len(rows), pa.string())}, schema=REMOVALS)
        write_partitioned(out.path(".arrow"), table, block, run.n_blocks)
        return {"removed": len(rows)}
    return cached(out, compute)


class SamePrefix(GlobalStage):
    """A dedup-like global stage: documents sharing their first 30 characters."""

    name = "same_prefix"
    columns = ("prefix",)

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        return {"prefix": pa.array([d.text[:30] for d in docs], pa.string())}

    def decide(self, ctx: GlobalContext) -> GlobalDecision:
        run = Shuffle.of(ctx)
        task = PrefixTask(run, ctx.blocks, self.name,
                          content_hash(self.fingerprint(), list(ctx.blocks), list(run.earlier)))
        run_batches(same_prefix, [task], "same prefix", ctx.progress)
        return GlobalDecision(run.earlier + (removal_file("same_prefix", task.digest),))


@pytest.fixture
def two_more_stages(monkeypatch):
    """The stage list with the two stages added, each one line; this module's classes
    travel to the Ray workers by value (they are not importable there)."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    stages = list(stage_list.STAGES)
    names = [s.name for s in stages]
    stages.insert(names.index("length") + 1,
                  StageDef("drop_marked", "document", DropMarked, lambda c, s: {},
                           counts="filtered"))
    stages.insert(names.index("fuzzy_dedup") + 2,
                  StageDef("same_prefix", "global", SamePrefix, lambda c, s: {},
                           counts="near_duplicates"))
    monkeypatch.setattr(stage_list, "STAGES", tuple(stages))
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def datamix(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("TOKENMILL_DATA_ROOT", raising=False)
    docs = [f"Document {i:02d} has its own words about topic {i * 7} and more." for i in range(20)]
    docs += [f"Document {i:02d} carries the {MARK} word." for i in range(20, 23)]
    docs += [f"One shared opening sentence here, then variant {i} of it." for i in range(4)]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text("---\nlicense: mit\n---\n")
    (tmp_path / "src" / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                         for t in docs))
    (tmp_path / "mix.yaml").write_text(
        "name: extra\ndata_root: .\nlicenses: {allow: [mit]}\n"
        "sources: [{name: src, path: src}]\nblock_documents: 10\n"
        "shards: {tokens_per_shard: 100000, val_fraction: 0.0}\n")
    return tmp_path / "mix.yaml"


def test_a_stage_of_each_scope_added_to_the_list_runs_and_is_counted(
        two_more_stages, datamix, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["run", str(datamix), "-q", "--num-cpus", "1", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    (src,) = manifest["sources"]
    assert src["counts"]["read"] == 27 and src["counts"]["kept"] == 21
    assert src["counts"]["filtered"] == {"drop_marked:marker": 3}
    assert src["counts"]["near_duplicates"] == 3
    assert src["stages"]["drop_marked"] == {"docs_in": 27, "docs_out": 24,
                                            "rejected": {"drop_marked:marker": 3}}
    assert src["stages"]["same_prefix"] == {"removed": 3}
    q = pq.read_table(out / "quarantine" / "src.parquet").to_pylist()
    removed = {r["key"]: (r["reason"], r["duplicate_of"]) for r in q}
    first = "src/docs.jsonl#000000023"
    assert sorted(removed.values()) == sorted(
        [("drop_marked:marker", None)] * 3 + [("same_prefix:duplicate", first)] * 3)
    # the summary's near-duplicates column and removal reasons, the report's columns
    row = next(line for line in printed.splitlines() if line.startswith("src "))
    assert row.split()[6] == "3"  # source, license, docs in, quarantined, license, exact, near
    assert "drop_marked:marker 3" in printed
    html = (out / "report.html").read_text()
    at = [html.index(f"after {n}") for n in ("length", "drop marked", "exact dedup",
                                              "same prefix")]
    assert at == sorted(at)  # the report's columns in stage-list order
    assert "<b>same_prefix:duplicate</b>: 3 removed" in html  # with its examples
    assert "<b>drop_marked:marker</b>: 3 removed" in html
