"""Exact-substring dedup (Lee et al. 2022, "Deduplicating Training Data Makes Language
Models Better", ExactSubstr): a global stage, after document-level dedup, that cuts every
token span of at least ``min_tokens`` tokens occurring more than once out of all its
occurrences but the first, in the global document order, per source or across sources.

The rule and the suffix-array search are :mod:`tokenmill.pipeline.dedup.substring_spans`.
Per block on the workers, :meth:`SubstringDedup.block_columns` stores each document's
tokens (tiktoken ``encode_ordinary`` with the datamix's tokenizer). The decision cuts the
kept documents, in the global order, into *parts* of about ``part_tokens`` tokens (whole
blocks; a part never spans two scopes), then on Ray:

1. per part (:func:`~.substring_tasks.index_part`, in parallel): its suffix array, the
   windows repeated inside it and its representatives;
2. per part (:func:`~.substring_tasks.cut_part`, in parallel): its representatives merged
   with those of every earlier part of its scope; the covered token spans mapped to
   characters (a span starting or ending inside a character takes it whole) and cut from
   the text. A document whose cut text fails the length filter (``filters``) is removed
   (quarantine ``reason="substring_dedup:removed"``, ``detail`` the length reason);
   otherwise each span becomes an edit (:data:`~tokenmill.pipeline.run.removals.EDITS`),
   which the tokenize task cuts and records in the quarantine
   (``reason="substring_dedup:edit:repeat"``, ``text`` the span, ``detail`` its offsets in
   characters and in this stage's tokens), and the cut text is tokenized again.

The decision does not depend on ``part_tokens``, the number of Ray workers or ``parts``.
Memory: a part's index task holds its text and about 13 bytes per token of suffix array,
LCP and inverse (int32 each); a cut task holds its part's and one earlier part's text and
representatives at a time.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmill.pipeline.config import SubstringDedupConfig, outside_identity
from tokenmill.pipeline.dedup.substring_tasks import CutTask, IndexTask, cut_part, index_part
from tokenmill.pipeline.run.intermediate import content_hash
from tokenmill.pipeline.run.prepare_task import read_block_columns
from tokenmill.pipeline.run.removals import Shuffle
from tokenmill.pipeline.run.tasks import run_each
from tokenmill.pipeline.stage import Document, GlobalContext, GlobalDecision, GlobalStage
from tokenmill.tokenizers import get_encoding

VERSION = 1
COUNTERS = ("tokens_in", "tokens_removed", "spans", "documents_edited", "documents_removed",
            "unmapped")


class SubstringDedup(GlobalStage):
    """Cut repeated token spans of at least ``min_tokens`` tokens (module docstring).

    Args:
        tokenizer: the tiktoken encoding the spans are counted in (the datamix's).
        min_tokens: the shortest span cut (Lee et al.: 50).
        scope: ``"source"`` (spans repeated inside a source) or ``"all"`` (across sources).
        part_tokens: tokens per suffix-array part (how the work is cut, not what it cuts).
        filters: the length filter's config; a cut document must still pass it.

    Raises:
        ValueError: ``min_tokens < 1``, ``part_tokens < 1`` or an unknown ``scope``.
    """

    name = "substring_dedup"
    version = 1
    how_cut = outside_identity(SubstringDedupConfig)
    columns = ("substring_tokens", "substring_length")

    def __init__(self, tokenizer: str = "gpt2", min_tokens: int = 50, scope: str = "source",
                 part_tokens: int = 50_000_000, filters: dict[str, Any] | None = None) -> None:
        if min_tokens < 1 or part_tokens < 1:
            raise ValueError("substring_dedup: min_tokens and part_tokens must be >= 1")
        if scope not in ("source", "all"):
            raise ValueError(f"substring_dedup: scope must be 'source' or 'all', got {scope!r}")
        super().__init__(tokenizer=tokenizer, min_tokens=min_tokens, scope=scope,
                         part_tokens=part_tokens, filters=dict(filters or {}))
        self.tokenizer, self.min_tokens, self.scope = tokenizer, min_tokens, scope
        self.part_tokens, self.filters = part_tokens, dict(filters or {})

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``substring_tokens``: large_list<uint32> token ids per document (no EOT);
        ``substring_length``: int32 their count."""
        enc = get_encoding(self.tokenizer)
        encoded = enc.encode_ordinary_batch([d.text for d in docs], num_threads=1)
        lengths = np.fromiter((len(t) for t in encoded), np.int64, count=len(encoded))
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        flat = np.fromiter((t for e in encoded for t in e), np.uint32, count=int(offsets[-1]))
        return {"substring_tokens": pa.LargeListArray.from_arrays(
                    pa.array(offsets, pa.int64()), pa.array(flat, pa.uint32())),
                "substring_length": pa.array(lengths, pa.int32())}

    def plan(self, ctx: GlobalContext, run: Shuffle) -> list[tuple[str, list[tuple[int, str]]]]:
        """The parts: ``(scope group, [(block index, digest), ...])`` in the global order;
        blocks with no kept document are left out."""
        parts: list[tuple[str, list[tuple[int, str]]]] = []
        size = 0
        for b, digest in enumerate(ctx.blocks):
            t = read_block_columns(run.prepare_work, digest, ["key", "substring_length"])
            keep = np.ones(len(t), np.bool_)
            keep[run.removed_rows(b)] = False
            if not keep.any():
                continue
            first = t.column("key")[int(np.argmax(keep))].as_py()
            group = first.split("/", 1)[0] if self.scope == "source" else ""
            n = int(pc.sum(t.column("substring_length").filter(pa.array(keep))).as_py() or 0)
            if not parts or parts[-1][0] != group or (size and size + n > self.part_tokens):
                parts.append((group, []))
                size = 0
            parts[-1][1].append((b, digest))
            size += n
        return parts

    def decide(self, ctx: GlobalContext) -> GlobalDecision:
        run = Shuffle.of(ctx)
        parts = self.plan(ctx, run)
        index = [IndexTask(run.work, run.prepare_work, run.earlier, tuple(blocks),
                           self.min_tokens, content_hash(self.name, VERSION, self.fingerprint(),
                                                         blocks, run.earlier))
                 for _, blocks in parts]
        run_each(index_part, index, "substring dedup: suffix arrays", ctx.progress,
                         unit="part")
        cuts = []
        for j, (group, blocks) in enumerate(parts):
            before = tuple(index[i].digest for i in range(j) if parts[i][0] == group)
            cuts.append(CutTask(run.work, run.prepare_work, index[j].digest, before,
                                tuple(blocks), self.min_tokens, self.tokenizer, self.filters,
                                self.name, run.n_blocks,
                                content_hash(self.name, VERSION, index[j].digest, before,
                                             self.fingerprint(), run.n_blocks)))
        results = run_each(cut_part, cuts, "substring dedup: cuts", ctx.progress, unit="part")
        own = tuple(f"substring_dedup/cut/{c.digest}.removals.arrow" for c in cuts)
        edits = tuple(f"substring_dedup/cut/{c.digest}.edits.arrow" for c in cuts)
        return GlobalDecision(run.earlier + own, self.record(results),
                              edits=edits)

    def record(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The manifest record: the config, and in all and per source the tokens in (this
        stage's tokens of the documents it saw), the tokens removed (cut, or in a removed
        document), the spans cut, the documents edited and removed (all in :data:`COUNTERS`),
        and in all the tokens out."""
        by_source: dict[str, Counter] = {}
        for res in results:
            for src, c in res["by_source"].items():
                by_source.setdefault(src, Counter()).update(c)
        total: Counter = Counter()
        for c in by_source.values():
            total.update(c)
        return {"min_tokens": self.min_tokens, "scope": self.scope,
                **{k: int(total[k]) for k in COUNTERS},
                "tokens_out": int(total["tokens_in"] - total["tokens_removed"]),
                "by_source": {s: {k: int(c[k]) for k in COUNTERS}
                              for s, c in sorted(by_source.items())}}
