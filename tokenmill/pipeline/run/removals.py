"""The global stages' decisions, in order, and the per-block removals they add up to.

Each global stage (:class:`~tokenmill.pipeline.stage.GlobalStage`) decides over all
prepared blocks and returns a :class:`~tokenmill.pipeline.stage.GlobalDecision`: its
removals and the earlier stages', as partitioned files under ``work/dedup/`` grouped by
block (:mod:`.partition_files`), columns :data:`REMOVALS`. :func:`decide_global` runs
the stages in stage-list order, then one ``removals`` task per block gathers the block's
rows of the last decision's files into ``work/dedup/removals/<digest>.parquet`` (``key,
kept, stage, detail``, sorted by key) and the block's rows of every decision's edit files
into ``<digest>.edits.parquet`` (columns :data:`EDITS` less ``block`` and ``row``), which
the block's tokenize task reads (:func:`load_removals`, :func:`load_edits`). The driver
holds only digests and counters.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill import storage
from tokenmill.pipeline.run.intermediate import (
    StageOutput,
    content_hash,
    work_file,
    write_parquet,
)
from tokenmill.pipeline.run.partition_files import cached, read_partitions
from tokenmill.pipeline.run.tasks import batch_cpu_seconds, run_batches
from tokenmill.pipeline.stage import GlobalContext, GlobalDecision, GlobalStage

#: part of the removals' content address: bump when their output changes
VERSION = 4
#: the columns of a removal file: the removed document (block index, row in the block,
#: key), the key of the document kept in its place, the stage that removed it, a detail
REMOVALS = pa.schema([("block", pa.int32()), ("row", pa.int32()), ("key", pa.string()),
                      ("kept", pa.string()), ("stage", pa.string()),
                      ("detail", pa.string())])
#: the columns of an edit file: the edited document (block, row, key), the stage and the
#: quarantine reason of its edit records (``<stage>:edit:<what>``), the characters
#: ``[start, end)`` cut from its text as the global stages saw it, and the same span in
#: the stage's own tokens of that text (``[token_start, token_end)``, -1 when none)
EDITS = pa.schema([("block", pa.int32()), ("row", pa.int32()), ("key", pa.string()),
                   ("stage", pa.string()), ("reason", pa.string()), ("start", pa.int64()),
                   ("end", pa.int64()), ("token_start", pa.int64()),
                   ("token_end", pa.int64())])


def removal_file(phase: str, digest: str) -> str:
    """The name (relative to :attr:`GlobalContext.work`) of a phase's partitioned file."""
    return f"{phase}/{digest}.arrow"


def read_removals(work: str, files: tuple[str, ...], block: int,
                  schema: pa.Schema = REMOVALS) -> pa.Table:
    """The rows of block ``block`` in the removal (or edit) ``files`` (columns
    ``schema``: :data:`REMOVALS` or :data:`EDITS`)."""
    if not files:
        return schema.empty_table()
    return read_partitions([work_file(work, f) for f in files], block)


@dataclass(frozen=True)
class Shuffle:
    """The settings every map and reduce task of one global stage's decision shares
    (small: never a per-block list, which would make ``n_blocks`` tasks cost
    ``n_blocks**2``).

    Attributes:
        work, prepare_work, parts: as in :class:`~tokenmill.pipeline.stage.GlobalContext`.
        n_blocks: the number of prepared blocks.
        earlier: the earlier global stages' removal files.
    """

    work: str
    prepare_work: str
    parts: int
    n_blocks: int
    earlier: tuple[str, ...] = ()

    @classmethod
    def of(cls, ctx: GlobalContext) -> Shuffle:
        earlier = ctx.earlier.removals if ctx.earlier is not None else ()
        return cls(ctx.work, ctx.prepare_work, ctx.parts, len(ctx.blocks), earlier)

    def removed_rows(self, block: int) -> np.ndarray:
        """Rows (int32) of block ``block`` that the earlier global stages removed."""
        return read_removals(self.work, self.earlier, block).column("row").to_numpy()


@dataclass(frozen=True)
class AssembleTask:
    """One block's removals and edits: its rows of ``files`` and ``edits`` (under
    ``work``)."""

    work: str
    files: tuple[str, ...]
    block: int
    digest: str
    edits: tuple[str, ...] = ()


def assemble(task: AssembleTask) -> dict[str, Any]:
    """Per block: its removals ``key, kept, stage, detail`` (sorted by key) and its edits
    (sorted by key and start; those of removed documents left out) as parquet; info
    ``removed``, ``edited`` (edit rows), ``kept_edits`` (:func:`_edit_counts`) and
    ``content`` (a digest of both, for tokenize's address)."""
    out = StageOutput(task.work, "removals", task.digest)

    def compute() -> dict[str, Any]:
        t = read_removals(task.work, task.files, task.block)
        t = t.take(pc.sort_indices(t, sort_keys=[("key", "ascending")]))
        t = t.select(["key", "kept", "stage", "detail"])
        write_parquet(out.path(".parquet"), t)
        e = read_removals(task.work, task.edits, task.block, EDITS)
        # a document a later stage removed is quarantined with its prepared text, which
        # the edits were cut from: its edits are not needed to rebuild it
        e = e.filter(pc.invert(pc.is_in(e.column("key"), t.column("key"))))
        e = e.take(pc.sort_indices(e, sort_keys=[("key", "ascending"), ("start", "ascending")]))
        e = e.drop_columns(["block", "row"])
        write_parquet(out.path(".edits.parquet"), e)
        rows = [[r["key"], [r["kept"], r["stage"], r["detail"]]] for r in t.to_pylist()]
        return {"removed": len(t), "edited": len(e), "kept_edits": _edit_counts(e),
                "content": content_hash(rows, e.to_pylist())}
    return cached(out, compute, (".parquet", ".edits.parquet"))


def _edit_counts(edits: pa.Table) -> dict[str, dict[str, dict[str, int]]]:
    """Per stage and source (the key's first part): ``spans`` and ``documents_edited``
    of ``edits`` (:data:`EDITS` rows)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    seen: set[tuple[str, str]] = set()
    for key, stage in zip(edits.column("key").to_pylist(), edits.column("stage").to_pylist(),
                          strict=True):
        c = out.setdefault(stage, {}).setdefault(key.split("/", 1)[0],
                                                 {"spans": 0, "documents_edited": 0})
        c["spans"] += 1
        if (stage, key) not in seen:
            seen.add((stage, key))
            c["documents_edited"] += 1
    return out


def _sum_edit_counts(infos: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """:func:`_edit_counts` summed over the blocks' ``infos``."""
    out: dict[str, dict[str, Counter]] = {}
    for x in infos:
        for stage, by_source in x.get("kept_edits", {}).items():
            for src, c in by_source.items():
                out.setdefault(stage, {}).setdefault(src, Counter()).update(c)
    return {st: {src: dict(c) for src, c in v.items()} for st, v in out.items()}


def load_removals(work: str, digest: str) -> dict[str, list]:
    """A block's removals: removed key -> [kept key, stage, detail or None]."""
    t = pq.read_table(StageOutput(work, "removals", digest).path(".parquet"))
    return {k: [kept, st, d] for k, kept, st, d in
            zip(*(t.column(c).to_pylist() for c in ("key", "kept", "stage", "detail")),
                strict=True)}


def _cpu_clock() -> float:
    """CPU seconds of this thread plus those of the Ray batch tasks finished so far."""
    return time.thread_time() + batch_cpu_seconds()


def load_edits(work: str, digest: str) -> dict[str, list[dict[str, Any]]]:
    """A block's edits: edited key -> its edit rows (:data:`EDITS` less ``block, row``),
    by ``start``."""
    t = pq.read_table(StageOutput(work, "removals", digest).path(".edits.parquet"))
    out: dict[str, list[dict[str, Any]]] = {}
    for r in t.to_pylist():
        out.setdefault(r["key"], []).append(r)
    return out


def decide_global(prepare_work: str, blocks: list[str], stages: list[GlobalStage],
                  parts: int, progress: bool = False, cpu: dict[str, float] | None = None
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The decisions of the global ``stages`` (in order) over the prepared ``blocks``
    (digests under ``prepare_work``, in the global document order), in ``parts`` hash
    partitions on the running Ray.

    Returns ``(per block, records)``: per block ``{"removals": digest of its removals
    file (``<prepare_work>/dedup/removals/<digest>.parquet``, see :func:`load_removals`
    and :func:`load_edits`), "content": digest of the removals and edits, "removed":
    count}``; the stages' manifest records by stage name (stages without one are left
    out), their edit counters counting the kept documents only
    (:meth:`~tokenmill.pipeline.stage.GlobalStage.with_kept_edits`). ``cpu``, when given,
    receives per stage name (and ``removals``, the per-block
    gathering) the CPU seconds of its decision: this thread's and its Ray tasks'
    (:func:`~.tasks.batch_cpu_seconds`).

    Raises:
        ValueError: ``parts < 1``.
    """
    if parts < 1:
        raise ValueError(f"dedup partitions must be >= 1, got {parts}")
    work = storage.join(prepare_work, "dedup")
    decision: GlobalDecision | None = None
    records: dict[str, Any] = {}
    cpu = {} if cpu is None else cpu
    edits: tuple[str, ...] = ()
    for stage in stages:
        clock = _cpu_clock()
        decision = stage.decide(GlobalContext(work, prepare_work, tuple(blocks), parts,
                                              progress, decision, edits))
        cpu[stage.name] = _cpu_clock() - clock
        edits += decision.edits
        if decision.record is not None:
            records[stage.name] = decision.record
    files = decision.removals if decision is not None else ()
    tasks = [AssembleTask(work, files, i, content_hash("removals", VERSION, i, files, edits),
                          edits)
             for i in range(len(blocks))]
    clock = _cpu_clock()
    infos = run_batches(assemble, tasks, "dedup: removals", progress)
    cpu["removals"] = _cpu_clock() - clock
    kept = _sum_edit_counts(infos)
    for stage in stages:
        if stage.name in records:
            records[stage.name] = stage.with_kept_edits(records[stage.name],
                                                        kept.get(stage.name, {}))
    return [{"removals": t.digest, "content": x["content"], "removed": x["removed"]}
            for t, x in zip(tasks, infos, strict=True)], records
