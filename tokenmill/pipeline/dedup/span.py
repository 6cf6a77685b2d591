"""Sentence-span and paragraph dedup, a global stage: every window of ``window``
consecutive sentences (datatrove's ``SentenceDedup``, C4's three-sentence spans) or
paragraphs (Dolma's paragraph dedup) that occurred earlier in the global document order
is cut from the later documents; the rules are :mod:`tokenmill.pipeline.dedup.span_units`.

Per block on the workers, :meth:`SpanDedup.block_columns` stores each document's window
keys, their first units and its units' character bounds. The decision runs on Ray in
hash partitions, like exact dedup (files under ``work/dedup/<phase>/``), nothing per
document on the driver:

1. ``span_map`` (per block): ``(key, block, row, unit)`` of every window of the documents
   the earlier global stages kept, partitioned by key (``P`` = ``dedup.partitions``);
2. ``span_repeats`` (per partition): per key the smallest ``(block, row, unit)`` is the
   first occurrence; the others are written as ``(block, row, unit)``, grouped by block;
3. ``span_cut`` (per run of about ``n_blocks / P`` blocks): each document's repeated
   windows become character spans (:func:`~.span_units.cut_spans`), less what an earlier
   global stage's edit already cuts. A document whose cut text is too short
   (:func:`~.span_units.too_short`) or fails the length filter is removed (quarantine
   ``reason="span_dedup:removed"``, ``detail`` why); otherwise each span is an edit, cut
   by the tokenize task and recorded in the quarantine
   (``reason="span_dedup:edit:repeated_sentences"`` or ``..._paragraphs``, ``text`` the
   span, ``detail`` its character offsets), and the cut text is tokenized again.

Memory: a map task holds one block, a reduce task about ``1/P`` of all windows (~20 bytes
each), a cut task one block's texts. Every output is content-addressed and reused on a
rerun; the decision does not depend on ``P`` or on the number of Ray workers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.dedup import span_tasks as tasks
from tokenmill.pipeline.dedup.span_units import MODES, unit_bounds, window_keys
from tokenmill.pipeline.run.intermediate import content_hash
from tokenmill.pipeline.run.removals import Shuffle
from tokenmill.pipeline.run.tasks import run_batches
from tokenmill.pipeline.stage import Document, GlobalContext, GlobalDecision, GlobalStage

COUNTERS = ("documents_in", "windows", "documents_edited", "documents_removed", "spans",
            "chars_removed")


def _lists(values: list[np.ndarray], dtype: pa.DataType) -> pa.LargeListArray:
    offsets = np.concatenate(([0], np.cumsum([v.size for v in values]))).astype(np.int64)
    flat = np.concatenate(values) if values else np.empty(0)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                         pa.array(flat.astype(dtype.to_pandas_dtype()), dtype))


class SpanDedup(GlobalStage):
    """Cut repeated sentence or paragraph windows (module docstring).

    Args:
        mode: ``"sentences"`` or ``"paragraphs"``.
        window: units per window (datatrove: 3 sentences; Dolma: 1 paragraph).
        min_doc_words, min_num_sentences: a cut document with fewer words or sentences
            is removed (datatrove: 50 and 3; ``0``: not checked).
        filters: the length filter's config; a cut document must still pass it.

    Raises:
        ValueError: an unknown ``mode`` or ``window < 1``.
    """

    name = "span_dedup"
    version = 1
    columns = ("span_keys", "span_starts", "span_bounds")

    def __init__(self, mode: str = "sentences", window: int = 3, min_doc_words: int = 50,
                 min_num_sentences: int = 3, filters: dict[str, Any] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"span_dedup: mode must be one of {MODES}, got {mode!r}")
        if window < 1:
            raise ValueError(f"span_dedup: window must be >= 1, got {window}")
        super().__init__(mode=mode, window=window, min_doc_words=min_doc_words,
                         min_num_sentences=min_num_sentences, filters=dict(filters or {}))
        self.mode, self.window = mode, window
        self.rule = tasks.CutRule(mode, window, min_doc_words, min_num_sentences,
                                  dict(filters or {}))

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``span_keys``: large_list<uint64> window keys per document; ``span_starts``:
        large_list<int32> each window's first unit; ``span_bounds``: large_list<int64>
        the units' character bounds (:func:`~.span_units.unit_bounds`)."""
        keys, starts, bounds = [], [], []
        for d in docs:
            b, units = unit_bounds(d.text, self.mode)
            k, s = window_keys(units, self.window)
            keys.append(k)
            starts.append(s)
            bounds.append(b)
        return {"span_keys": _lists(keys, pa.uint64()),
                "span_starts": _lists(starts, pa.int32()),
                "span_bounds": _lists(bounds, pa.int64())}

    def decide(self, ctx: GlobalContext) -> GlobalDecision:
        """The map, reduce and cut phases; the removals of ``ctx.earlier`` and its own,
        and its own edits."""
        run = Shuffle.of(ctx)
        if not ctx.blocks:
            return GlobalDecision(run.earlier, self.record([], []))
        fp, parts = self.fingerprint(), ctx.parts
        maps = [tasks.MapTask(run, i, d, content_hash("span_map", tasks.VERSION, fp, parts, d,
                                                      i, run.earlier))
                for i, d in enumerate(ctx.blocks)]
        infos = run_batches(tasks.span_map, maps, "span dedup: map", ctx.progress)
        digests = tuple(t.digest for t in maps)
        all_maps = content_hash(digests)
        reduces = [tasks.ReduceTask(run, digests, p, content_hash(
                       "span_repeats", tasks.VERSION, fp, parts, p, all_maps))
                   for p in range(parts)]
        run_batches(tasks.span_repeats, reduces, "span dedup: partitions", ctx.progress)
        repeats = tuple(t.digest for t in reduces)
        step = max(1, -(-len(ctx.blocks) // parts))
        cuts = []
        for lo in range(0, len(ctx.blocks), step):
            blocks = tuple(enumerate(ctx.blocks))[lo : lo + step]
            cuts.append(tasks.CutTask(run, self.name, self.rule, repeats, blocks, ctx.edits,
                                      content_hash("span_cut", tasks.VERSION, fp, blocks,
                                                   content_hash(repeats), ctx.edits,
                                                   run.earlier)))
        results = run_batches(tasks.span_cut, cuts, "span dedup: cuts", ctx.progress)
        own = tuple(tasks.cut_file(c.digest, "removals") for c in cuts)
        edits = tuple(tasks.cut_file(c.digest, "edits") for c in cuts)
        return GlobalDecision(run.earlier + own, self.record(infos, results), edits=edits)

    def record(self, maps: list[dict[str, Any]], cuts: list[dict[str, Any]]
               ) -> dict[str, Any]:
        """The manifest record: the config, and in all and per source the documents
        that reached the stage and their windows, the documents edited and removed, the
        spans cut and the characters removed (cut, or in a removed document)."""
        by_source: dict[str, Counter] = {}
        for res in [*maps, *cuts]:
            for src, c in res["by_source"].items():
                by_source.setdefault(src, Counter()).update(c)
        total: Counter = Counter()
        for c in by_source.values():
            total.update(c)
        return {"mode": self.mode, "window": self.window,
                "min_doc_words": self.rule.min_doc_words,
                "min_num_sentences": self.rule.min_num_sentences,
                **{k: int(total[k]) for k in COUNTERS},
                "by_source": {s: {k: int(c[k]) for k in COUNTERS}
                              for s, c in sorted(by_source.items())}}
