"""The per-block tokenize task: drop the block's documents the global stages removed,
cut the spans they edited out of the kept ones (an edit record per span in the
quarantine), then tokenize the resulting texts
(:class:`~tokenmill.pipeline.run.tokenize.Tokenize`): an edited document is tokenized
again as a whole, so every token pair in the shards is one that real text encodes to.

A plain function of its :class:`TokenizeTask` (the executor runs it as a Ray task), so the
output never depends on which worker ran it or in what order.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.pipeline.run import quarantine
from tokenmill.pipeline.run.intermediate import StageOutput, fault_injection_delay, write_parquet
from tokenmill.pipeline.run.removals import load_edits, load_removals
from tokenmill.pipeline.run.stats import utf8_size
from tokenmill.pipeline.stage import EDIT_REASON_MARK, Rejection, is_edit_reason

if TYPE_CHECKING:
    from tokenmill.pipeline.run.stage_list import StageCall


@dataclass(frozen=True)
class TokenizeTask:
    """One block's tokenization.

    Attributes:
        work: the ``work/`` folder; the output goes to ``work/tokenize/<digest>.*``.
        digest: the output's content address.
        prepare_digest: the prepared block's.
        source: the block's source.
        dedup_work, removals: the folder and digest of the block's removals file
            (:func:`~tokenmill.pipeline.run.removals.load_removals`).
        stage: the tokenize stage.
        meta_columns: the per-document metadata columns carried to the shard sidecar.
    """

    work: str
    digest: str
    prepare_digest: str
    source: str
    dedup_work: str
    removals: str
    stage: StageCall
    meta_columns: tuple[str, ...]


def _drop_removed(source: str, removals: dict[str, list], keys: list[str], texts: list[str]
                  ) -> tuple[list[int], list[Rejection], Counter]:
    """Indices kept, quarantine rows of the removed, removed count per stage."""
    kept_idx: list[int] = []
    rejected: list[Rejection] = []
    removed: Counter = Counter()
    for i, k in enumerate(keys):
        if k in removals:
            twin, stage, detail = removals[k]
            removed[stage] += 1
            # a removal without a kept twin is a global filter's, not a duplicate
            reason = f"{stage}:duplicate" if twin is not None else f"{stage}:removed"
            rejected.append(Rejection(key=k, source=source, stage=stage,
                                      reason=reason, text=texts[i],
                                      duplicate_of=twin, detail=detail))
        else:
            kept_idx.append(i)
    return kept_idx, rejected, removed


def _document_edits(prepare_quarantine: str, removed: set[str]
                    ) -> tuple[dict[str, dict[str, int]], dict[str, Counter]]:
    """The document stages' edit records (reason ``<stage>:edit:<what>``) in a block's
    prepared quarantine: of the documents in ``removed``, per stage and ``what`` their
    count (their rows are kept: a global stage's removal row holds the edited text, so
    they rebuild the original; but the manifest counts the edits of kept documents
    only); of the kept documents, per stage ``spans`` and ``documents``."""
    t = quarantine.read_quarantine(prepare_quarantine).select(["key", "reason"])
    of_removed: dict[str, Counter] = {}
    of_kept: dict[str, Counter] = {}
    seen: set[tuple[str, str]] = set()
    for key, reason in zip(*(t.column(c).to_pylist() for c in ("key", "reason")), strict=True):
        if not is_edit_reason(reason or ""):
            continue
        stage, _, what = reason.partition(EDIT_REASON_MARK)
        if key in removed:
            of_removed.setdefault(stage, Counter())[what] += 1
        else:
            _count_edit(of_kept, seen, stage, key)
    return {st: dict(sorted(c.items())) for st, c in sorted(of_removed.items())}, of_kept


def _count_edit(counts: dict[str, Counter], seen: set[tuple[str, str]], stage: str,
                key: str) -> None:
    """Add one edit of document ``key`` by ``stage`` to ``counts`` (``spans``, and
    ``documents`` when ``(stage, key)`` is not in ``seen``)."""
    c = counts.setdefault(stage, Counter())
    c["spans"] += 1
    if (stage, key) not in seen:
        seen.add((stage, key))
        c["documents"] += 1


def apply_edits(source: str, key: str, text: str, edits: list[dict[str, Any]]
                ) -> tuple[str, list[Rejection]]:
    """``text`` less the character spans of ``edits`` (disjoint, sorted by ``start``), and
    one edit record per span: ``reason`` the edit's, ``text`` the span, ``detail`` JSON
    ``{"start", "end", "token_start", "token_end"}`` (offsets in ``text``). The original
    is the edited text with each span inserted back at its ``start``, in order."""
    pieces: list[str] = []
    records: list[Rejection] = []
    at = 0
    for e in edits:
        pieces.append(text[at : e["start"]])
        at = e["end"]
        detail = {k: e[k] for k in ("start", "end", "token_start", "token_end")}
        records.append(Rejection(key=key, source=source, stage=e["stage"], reason=e["reason"],
                                 text=text[e["start"] : e["end"]],
                                 detail=json.dumps(detail, sort_keys=True)))
    pieces.append(text[at:])
    return "".join(pieces), records


def tokenize_block(spec: TokenizeTask) -> dict[str, Any]:
    """Tokenize one prepared block, less its documents removed by the global stages.

    Returns info: ``docs_in``, ``removed`` (stage -> documents), ``kept``, ``tokens``,
    ``edits`` (stage -> ``{"spans", "documents"}``: the edits of the kept documents),
    ``removed_edits`` (:func:`_document_edits`),
    ``text_bytes`` (UTF-8 bytes of the kept documents' text), ``reused``, ``recovered``,
    and, when computed, ``timings``: ``{"tokenize": [CPU seconds, documents tokenized,
    text bytes]}`` (:mod:`~tokenmill.pipeline.run.stats`).
    """
    fault_injection_delay()
    cpu0 = time.process_time()
    out = StageOutput(spec.work, "tokenize", spec.digest)
    done = out.load_done()
    if done is not None:
        return done["info"] | {"reused": True}
    table = pq.read_table(StageOutput(spec.work, "prepare", spec.prepare_digest)
                          .path(".docs.parquet"))
    keys = table.column("key").to_pylist()
    texts = table.column("text").to_pylist()
    removals = load_removals(spec.dedup_work, spec.removals)
    kept_idx, rejected, removed = _drop_removed(spec.source, removals, keys, texts)
    removed_edits, cuts = _document_edits(
        StageOutput(spec.work, "prepare", spec.prepare_digest).path(".quarantine.parquet"),
        set(removals))
    edits = load_edits(spec.dedup_work, spec.removals)
    kept_texts = []
    for i in kept_idx:
        text = texts[i]
        if keys[i] in edits:
            text, records = apply_edits(spec.source, keys[i], text, edits[keys[i]])
            rejected += records
            seen: set[tuple[str, str]] = set()
            for r in records:
                _count_edit(cuts, seen, r.stage, r.key)
        kept_texts.append(text)
    step = spec.stage.build()
    kept_keys = [keys[i] for i in kept_idx]
    tokens, lengths, splits = step.encode(kept_keys, kept_texts)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    cols = {
        "key": pa.array(kept_keys, pa.string()),
        "split": pa.array(splits, pa.string()),
        "tokens": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                                pa.array(tokens, pa.uint32())),
    }
    for c in (c for c in spec.meta_columns if c in table.column_names):
        cols[c] = table.column(c).take(pa.array(kept_idx, pa.int64())).combine_chunks()
    write_parquet(out.path(".tokens.parquet"), pa.table(cols))
    quarantine.write_quarantine(out.path(".quarantine.parquet"), quarantine.to_table(rejected))
    text_bytes = sum(utf8_size(t) for t in kept_texts)
    info = {"docs_in": len(keys), "removed": dict(sorted(removed.items())),
            "kept": len(kept_idx), "tokens": int(lengths.sum()), "text_bytes": text_bytes,
            "edited": sum(1 for k in kept_keys if k in edits), "removed_edits": removed_edits,
            "edits": {st: dict(sorted(c.items())) for st, c in sorted(cuts.items())}}
    out.commit([".tokens.parquet", ".quarantine.parquet"], info)
    timings = {"tokenize": [time.process_time() - cpu0, len(kept_idx), text_bytes]}
    return info | {"reused": False, "recovered": [out.problem] if out.problem else [],
                   "timings": timings}
