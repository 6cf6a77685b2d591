"""The three Ray task kinds of sentence-span and paragraph dedup
(:mod:`tokenmill.pipeline.dedup.span`): ``span_map`` per block, ``span_repeats`` per hash
partition, ``span_cut`` per run of blocks. Each output is content-addressed and reused on
a rerun."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.dedup import span_units as units
from tokenmill.pipeline.dedup.cut_rows import CutRows
from tokenmill.pipeline.document.length import LengthFilter
from tokenmill.pipeline.run.intermediate import StageOutput
from tokenmill.pipeline.run.partition_files import (
    cached,
    mix64,
    read_partitions,
    write_partitioned,
)
from tokenmill.pipeline.run.prepare_task import read_block_columns
from tokenmill.pipeline.run.removals import EDITS, Shuffle, read_removals
from tokenmill.pipeline.stage import Document

#: part of every phase's content address: bump when a phase's output changes
VERSION = 2


def _source(key: str) -> str:
    return key.split("/", 1)[0]


def cut_file(digest: str, what: str) -> str:
    """The name (relative to the global stages' folder) of a cut task's ``removals`` or
    ``edits`` file."""
    return f"span_cut/{digest}.{what}.arrow"


@dataclass(frozen=True)
class MapTask:
    """Block ``block`` (prepared block ``prepare``)."""

    run: Shuffle
    block: int
    prepare: str
    digest: str


def span_map(task: MapTask) -> dict[str, Any]:
    """Per block: ``(key, block, row, unit)`` of the kept documents' windows, partitioned
    by key; info ``by_source``: ``documents_in`` and ``windows`` per source."""
    run = task.run
    out = StageOutput(run.work, "span_map", task.digest)

    def compute() -> dict[str, Any]:
        t = read_block_columns(run.prepare_work, task.prepare,
                               ["key", "span_keys", "span_starts"])
        keep = np.ones(len(t), bool)
        keep[run.removed_rows(task.block)] = False
        keys_col = t.column("span_keys").combine_chunks()
        offsets = keys_col.offsets.to_numpy()
        counts = np.diff(offsets)
        row = np.repeat(np.arange(len(t), dtype=np.int32), counts)
        mine = keep[row]
        key = keys_col.values.to_numpy()[mine]
        unit = t.column("span_starts").combine_chunks().values.to_numpy()[mine]
        table = pa.table({"key": pa.array(key, pa.uint64()),
                          "block": pa.array(np.full(key.size, task.block, np.int32)),
                          "row": pa.array(row[mine]), "unit": pa.array(unit, pa.int32())})
        part = (mix64(key) % np.uint64(run.parts)).astype(np.int64)
        write_partitioned(out.path(".arrow"), table, part, run.parts)
        by_source: dict[str, Counter] = {}
        for k, n, kept in zip(t.column("key").to_pylist(), counts.tolist(), keep.tolist(),
                              strict=True):
            if kept:
                c = by_source.setdefault(_source(k), Counter())
                c["documents_in"] += 1
                c["windows"] += n
        return {"by_source": {s: dict(c) for s, c in sorted(by_source.items())}}
    return cached(out, compute)


@dataclass(frozen=True)
class ReduceTask:
    """Hash partition ``p`` of every map file (digests ``maps``)."""

    run: Shuffle
    maps: tuple[str, ...]
    p: int
    digest: str


def span_repeats(task: ReduceTask) -> dict[str, Any]:
    """Per hash partition: every window but the first of its key, as ``(block, row,
    unit)`` grouped by block; info ``repeated``."""
    run = task.run
    out = StageOutput(run.work, "span_repeats", task.digest)

    def compute() -> dict[str, Any]:
        t = read_partitions([StageOutput(run.work, "span_map", d).path(".arrow")
                             for d in task.maps], task.p)
        key, blk = t.column("key").to_numpy(), t.column("block").to_numpy()
        row, unit = t.column("row").to_numpy(), t.column("unit").to_numpy()
        order = np.lexsort((unit, row, blk, key))
        later = np.zeros(order.size, bool)
        later[1:] = key[order][1:] == key[order][:-1]
        rep = order[later]
        table = pa.table({"block": pa.array(blk[rep], pa.int32()),
                          "row": pa.array(row[rep], pa.int32()),
                          "unit": pa.array(unit[rep], pa.int32())})
        write_partitioned(out.path(".arrow"), table, blk[rep], run.n_blocks)
        return {"repeated": int(rep.size)}
    return cached(out, compute)


@dataclass(frozen=True)
class CutRule:
    """What a document's repeated windows become: the units (``mode``, ``window``), the
    minimums a cut document must keep, and the length filter's config."""

    mode: str
    window: int
    min_doc_words: int
    min_num_sentences: int
    filters: dict[str, Any]

    def why_removed(self, key: str, text: str, cuts: list[tuple[int, int]]) -> str | None:
        """Why ``text`` less ``cuts`` is removed (:func:`~.span_units.too_short`, then the
        length filter), or ``None``."""
        why = units.too_short(text, cuts, self.mode, self.min_doc_words,
                              self.min_num_sentences)
        kept = Document(key, _source(key), units.apply_cuts(text, cuts))
        return why or LengthFilter(**self.filters).reason(kept)


@dataclass(frozen=True)
class CutTask:
    """The cuts of a run of blocks.

    Attributes:
        run: the decision's settings; stage: the stage's name; rule: the cut rule.
        repeats: the ``span_repeats`` digests; blocks: ``(block index, digest)`` of the
            run; edits: the earlier global stages' edit files.
    """

    run: Shuffle
    stage: str
    rule: CutRule
    repeats: tuple[str, ...]
    blocks: tuple[tuple[int, str], ...]
    edits: tuple[str, ...]
    digest: str


def subtract(spans: list[tuple[int, int]], taken: list[tuple[int, int]]
             ) -> list[tuple[int, int]]:
    """The parts of the sorted, disjoint ``spans`` outside the sorted, disjoint
    ``taken``."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        for c, d in taken:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sorted, disjoint union of two lists of spans."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(a + b):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _block_cuts(task: CutTask, b: int, digest: str, rows_out: CutRows,
                by_source: dict[str, Counter]) -> None:
    rep = read_partitions([StageOutput(task.run.work, "span_repeats", d).path(".arrow")
                           for d in task.repeats], b)
    if not rep.num_rows:
        return
    rows, unit = rep.column("row").to_numpy(), rep.column("unit").to_numpy()
    t = read_block_columns(task.run.prepare_work, digest, ["key", "text", "span_bounds"])
    earlier: dict[int, list[tuple[int, int]]] = {}
    for e in read_removals(task.run.work, task.edits, b, EDITS).to_pylist():
        earlier.setdefault(e["row"], []).append((e["start"], e["end"]))
    rule, what = task.rule, f"{task.stage}:edit:repeated_{task.rule.mode}"
    for r in np.unique(rows).tolist():
        key, text = t.column("key")[r].as_py(), t.column("text")[r].as_py()
        bounds = np.asarray(t.column("span_bounds")[r].values.to_numpy(), np.int64)
        taken = sorted(earlier.get(r, []))
        cuts = subtract(units.cut_spans(text, bounds, unit[rows == r], rule.window,
                                        rule.mode), taken)
        # what an earlier stage's cut leaves of a run may be only the whitespace around
        # it: kept, not an edit of its own
        cuts = [(s, e) for s, e in cuts if not text[s:e].isspace()]
        if not cuts:
            continue
        c = by_source.setdefault(_source(key), Counter())
        why = rule.why_removed(key, text, union(cuts, taken))
        if why is not None:
            c["documents_removed"] += 1
            c["chars_removed"] += len(text)
            rows_out.remove((b, r), key, why, len(cuts), rule.mode[:-1])
            continue
        c["documents_edited"] += 1
        c["spans"] += len(cuts)
        c["chars_removed"] += sum(e - s for s, e in cuts)
        rows_out.edit((b, r), key, what, [(s, e, -1, -1) for s, e in cuts])


def span_cut(task: CutTask) -> dict[str, Any]:
    """Removals and edits of a run of blocks (see :mod:`~.span`); info ``by_source``:
    ``documents_edited``, ``documents_removed``, ``spans``, ``chars_removed``."""
    out = StageOutput(task.run.work, "span_cut", task.digest)

    def compute() -> dict[str, Any]:
        rows_out = CutRows(task.stage)
        by_source: dict[str, Counter] = {}
        for b, digest in task.blocks:
            _block_cuts(task, b, digest, rows_out, by_source)
        rows_out.write(out, task.run.n_blocks)
        return {"by_source": {s: dict(sorted(c.items())) for s, c in sorted(by_source.items())}}
    return cached(out, compute, (".removals.arrow", ".edits.arrow"))
