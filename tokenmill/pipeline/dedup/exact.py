"""Exact dedup, a global stage: the first occurrence of a normalized text in the global
document order (block, then row) is kept; later ones are removed with ``duplicate_of``
the first one's key. Decided in hash partitions on Ray, nothing per document on the
driver (files under ``work/dedup/<phase>/``, :mod:`tokenmill.pipeline.run.partition_files`):

1. ``exact_map`` (per block): ``(hash, block, row, key)`` of the documents the earlier
   global stages kept, partitioned by content hash (``P`` = ``dedup.partitions``).
2. ``exact`` (per partition): every row of its hash range from every block; per hash the
   smallest ``(block, row)`` is kept, the others are written as removals (columns
   :data:`~tokenmill.pipeline.run.removals.REMOVALS`), grouped by block.

Memory: a map task holds one block, a reduce task about ``1/P`` of all rows (~70 bytes a
document). Every phase's output is content-addressed (its inputs' digests,
:data:`VERSION`, the stage's fingerprint and ``P``) and committed with checksums, so a
rerun reuses every complete partition; the decision does not depend on ``P`` or on the
number of Ray workers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.run.intermediate import StageOutput, content_hash
from tokenmill.pipeline.run.partition_files import (
    cached,
    fixed_width,
    read_partitions,
    write_partitioned,
)
from tokenmill.pipeline.run.prepare_task import read_block_columns
from tokenmill.pipeline.run.removals import REMOVALS, Shuffle, removal_file
from tokenmill.pipeline.run.tasks import run_batches
from tokenmill.pipeline.stage import Document, GlobalContext, GlobalDecision, GlobalStage

#: part of every phase's content address: bump when a phase's output changes
VERSION = 2


def text_hash(text: str) -> bytes:
    """16-byte blake2b of the UTF-8 text: the exact-dedup key (collisions ~2^-64 at 2^32 docs)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def hash_partition(hashes: np.ndarray, parts: int) -> np.ndarray:
    """int64 partition of each 16-byte content hash (uint8[n, 16]): its first 8 bytes as a
    little-endian integer, modulo ``parts``."""
    low = np.ascontiguousarray(hashes[:, :8]).view("<u8").ravel()
    return (low % np.uint64(parts)).astype(np.int64)


@dataclass(frozen=True)
class ExactMapTask:
    """Block ``block`` (prepared block ``prepare``)."""

    run: Shuffle
    block: int
    prepare: str
    digest: str


@dataclass(frozen=True)
class ExactReduceTask:
    """Hash partition ``p`` of every map file (digests ``maps``)."""

    run: Shuffle
    stage: str
    maps: tuple[str, ...]
    p: int
    digest: str


def exact_map(task: ExactMapTask) -> dict[str, Any]:
    """Per block: ``(hash, block, row, key)`` partitioned by content hash."""
    run = task.run
    out = StageOutput(run.work, "exact_map", task.digest)

    def compute() -> dict[str, Any]:
        t = read_block_columns(run.prepare_work, task.prepare, ["key", "hash"])
        keep = np.ones(len(t), bool)
        keep[run.removed_rows(task.block)] = False
        rows = np.flatnonzero(keep).astype(np.int32)
        t = t.take(pa.array(rows, pa.int64()))
        table = pa.table({"hash": t.column("hash"),
                          "block": pa.array(np.full(len(t), task.block, np.int32)),
                          "row": pa.array(rows), "key": t.column("key")})
        part = hash_partition(fixed_width(t.column("hash"), 16), run.parts)
        write_partitioned(out.path(".arrow"), table, part, run.parts)
        return {"docs": len(t)}
    return cached(out, compute)


def exact_reduce(task: ExactReduceTask) -> dict[str, Any]:
    """Per hash partition: the first ``(block, row)`` of every hash is kept; the others
    are written as removals grouped by block."""
    run = task.run
    out = StageOutput(run.work, "exact", task.digest)

    def compute() -> dict[str, Any]:
        t = read_partitions([StageOutput(run.work, "exact_map", d).path(".arrow")
                             for d in task.maps], task.p)
        h = fixed_width(t.column("hash"), 16)
        lo = np.ascontiguousarray(h[:, :8]).view("<u8").ravel()
        hi = np.ascontiguousarray(h[:, 8:]).view("<u8").ravel()
        blk = t.column("block").to_numpy()
        row = t.column("row").to_numpy()
        order = np.lexsort((row, blk, hi, lo))
        new = np.ones(len(order), bool)
        new[1:] = (lo[order][1:] != lo[order][:-1]) | (hi[order][1:] != hi[order][:-1])
        first = order[np.flatnonzero(new)][np.cumsum(new) - 1]
        dup, kept = order[~new], first[~new]
        keys = t.column("key")
        removed = pa.table({"block": pa.array(blk[dup], pa.int32()),
                            "row": pa.array(row[dup], pa.int32()),
                            "key": keys.take(pa.array(dup, pa.int64())),
                            "kept": keys.take(pa.array(kept, pa.int64())),
                            "stage": pa.array([task.stage] * len(dup), pa.string()),
                            "detail": pa.nulls(len(dup), pa.string())}, schema=REMOVALS)
        write_partitioned(out.path(".arrow"), removed, blk[dup], run.n_blocks)
        return {"docs": len(t), "removed": int(len(dup))}
    return cached(out, compute)


class ExactDedup(GlobalStage):
    """Exact dedup of the documents the earlier global stages kept (see the module
    docstring). Its decision has ``same_text_by_hash`` when it is the first global stage:
    a later stage may re-point its removals."""

    name = "exact_dedup"
    version = 1
    columns = ("hash",)

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``hash``: binary(16) :func:`text_hash` per document."""
        return {"hash": pa.array([text_hash(d.text) for d in docs], pa.binary(16))}

    def decide(self, ctx: GlobalContext) -> GlobalDecision:
        """The map and reduce phases; the removals of ``ctx.earlier`` and its own."""
        run = Shuffle.of(ctx)
        earlier = run.earlier
        if not ctx.blocks:
            return GlobalDecision(earlier)
        fp, parts = self.fingerprint(), ctx.parts
        maps = [ExactMapTask(run, i, d, content_hash("exact_map", VERSION, fp, parts, d, i,
                                                     earlier))
                for i, d in enumerate(ctx.blocks)]
        run_batches(exact_map, maps, "exact dedup: map", ctx.progress)
        digests = tuple(t.digest for t in maps)
        all_maps = content_hash(digests)
        reduces = [ExactReduceTask(run, self.name, digests, p,
                                   content_hash("exact", VERSION, fp, parts, p, all_maps))
                   for p in range(parts)]
        run_batches(exact_reduce, reduces, "exact dedup: partitions", ctx.progress)
        own = tuple(removal_file("exact", t.digest) for t in reduces)
        return GlobalDecision(earlier + own, same_text_by_hash=not earlier)
