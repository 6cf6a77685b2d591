"""Decontamination: documents that share an n-gram of normalized words with an eval set
are removed, or the overlapping spans cut out of them (GPT-3's 13-gram overlap, Brown et
al. 2020; the rules of datatrove's ``NGramsDecontFilter``: 12-grams of the label,
optionally of the query, and those that span query and label, see
:mod:`tokenmill.pipeline.decont.text`).

The eval-set index is built once per datamix on the driver (:func:`build_kwargs`, content
addressed under ``<output>/work/decont``; with the output in an object store, committed
there and copied once per node) and memory-mapped by each worker (a bucketed
sorted hash array: two memory reads an n-gram, whatever the eval sets' size).

``mode="remove"``: a matching document is quarantined with reason
``contaminated:<eval set>`` (so the manifest and the report count removals per eval set)
and ``detail`` a JSON object with ``eval_set``, ``example_id`` and ``ngram`` (the first of
the document's n-grams found in the index).

``mode="cut"``: every matching n-gram's words are mapped back to their characters in the
document (:func:`~tokenmill.pipeline.decont.text.word_spans`: first word's start to last
word's end), overlapping and touching spans merged, and cut out; the rest is kept and,
since the stage runs before tokenization, tokenized as the text it now is. Cutting can
join words into a new matching n-gram, so the kept text is matched again until none is
left. Each cut is an edit record in the quarantine (as :mod:`~tokenmill.pipeline.document.pii`
writes them): reason ``decontaminate:edit:<eval set>``, ``text`` the cut characters,
``detail`` JSON ``{"start", "end", "replacement": "", "eval_set", "example_id", "ngram"}``
with offsets in the text before this stage and the span's first matching n-gram; so the
original text is the kept text with each record's ``text`` put back at its ``start``.
Spans cut count per eval set in ``extra`` (the manifest's ``decontamination_cuts``). A
document left shorter than the length filters' minimum is removed whole instead, reason
``contaminated:<eval set>:<length reason>``; one whose words cannot be placed in its text
(see :func:`~tokenmill.pipeline.decont.text.word_spans`) is removed as in remove mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from tokenmill import storage
from tokenmill.pipeline.config import DatamixConfig, SourceConfig
from tokenmill.pipeline.decont.index import contains, ensure_index, load_examples, load_index
from tokenmill.pipeline.decont.text import (
    hash_strings,
    ngram_strings,
    normalized_words,
    word_spans,
)
from tokenmill.pipeline.document.length import LengthFilter
from tokenmill.pipeline.stage import Document, DocumentStage, Rejection

#: rounds of matching the kept text again after a cut (each round cuts at least n words)
MAX_CUT_ROUNDS = 32


def build_kwargs(cfg: DatamixConfig, source: SourceConfig) -> dict[str, Any] | None:
    """The stage's constructor arguments (building the index if needed), or ``None``
    when the datamix has no ``decontamination``."""
    if cfg.decontamination is None:
        return None
    work = storage.join(storage.normalize(cfg.output_dir or "."), "work")
    index = ensure_index(cfg.decontamination.model_dump(), cfg.data_root, work)
    kwargs: dict[str, Any] = {"index": index, "n": cfg.decontamination.n}
    if cfg.decontamination.mode == "cut":
        kwargs |= {"mode": "cut", "min_chars": cfg.filters.min_chars,
                   "min_words": cfg.filters.min_words}
    return kwargs


def _merge(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(start, end, hit)`` spans merged where they overlap or touch, each keeping the
    ``hit`` of its earliest span; sorted by start."""
    out: list[tuple[int, int, int]] = []
    for s, e, hit in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e), out[-1][2])
        else:
            out.append((s, e, hit))
    return out


class Decontaminate(DocumentStage):
    """Remove documents sharing an ``n``-gram with the eval-set index at ``index``, or
    (``mode="cut"``) cut the matching spans out (see the module docstring).

    Args:
        index: the index folder (:func:`~tokenmill.pipeline.decont.index.ensure_index`).
        n: words per n-gram (the index's).
        mode: ``"remove"`` or ``"cut"``.
        min_chars, min_words: cut mode: a document left shorter is removed.
    """

    name = "decontaminate"
    version = 1

    def __init__(self, index: str, n: int = 12, mode: str = "remove", min_chars: int = 1,
                 min_words: int = 1) -> None:
        config: dict[str, Any] = {"index": index, "n": n}
        if mode != "remove":  # remove mode's fingerprint is the one it always had
            config |= {"mode": mode, "min_chars": min_chars, "min_words": min_words}
        super().__init__(**config)
        if mode not in ("remove", "cut"):
            raise ValueError(f"decontaminate: mode must be 'remove' or 'cut', got {mode!r}")
        self.n, self.mode = n, mode
        self._length = LengthFilter(min_chars=min_chars, min_words=min_words)
        self._hashes: np.ndarray | None = None
        self._owners: np.ndarray | None = None
        self._buckets: np.ndarray | None = None
        self._examples: list[list[str]] | None = None

    def _found(self, grams: list[str]) -> np.ndarray:
        """Per n-gram of ``grams``, its position in the index or -1 (``int64``)."""
        if self._hashes is None:
            self._hashes, self._owners, self._buckets = load_index(self.config["index"])
        if not grams or not len(self._hashes):
            return np.full(len(grams), -1, dtype=np.int64)
        return contains(self._hashes, self._buckets, hash_strings(grams))

    def match(self, text: str) -> tuple[int, str] | None:
        """``(example number, n-gram)`` of the first of ``text``'s n-grams in the index,
        or ``None``."""
        grams = ngram_strings(normalized_words(text), self.n)
        found = self._found(grams)
        hits = np.flatnonzero(found >= 0)
        if not len(hits):
            return None
        first = int(hits[0])
        return int(self._owners[found[first]]), grams[first]

    def _detail(self, example: int, ngram: str) -> dict[str, str]:
        if self._examples is None:
            self._examples = load_examples(self.config["index"])
        eval_set, example_id = self._examples[example]
        return {"eval_set": eval_set, "example_id": example_id, "ngram": ngram}

    def _hit_spans(self, text: str) -> list[tuple[int, int, dict[str, str]]] | None:
        """Merged character spans of ``text`` covered by its matching n-grams, each with
        the detail of its first n-gram; ``None`` when words cannot be placed in it."""
        placed = word_spans(text)
        if placed is None:
            return None
        words, spans = placed
        grams = ngram_strings(words, self.n)
        found = self._found(grams)
        hits = np.flatnonzero(found >= 0).tolist()
        merged = _merge([(spans[i][0], spans[i + self.n - 1][1], i) for i in hits])
        return [(s, e, self._detail(int(self._owners[found[i]]), grams[i]))
                for s, e, i in merged]

    def cut(self, text: str) -> list[tuple[int, int, dict[str, str]]] | None:
        """The spans to cut out of ``text`` (``(start, end, detail)``, character offsets,
        sorted, disjoint) so that no n-gram of what is left is in the index; ``None``
        when words cannot be placed in a text (the document is then removed whole)."""
        cuts: list[tuple[int, int, dict[str, str]]] = []
        kept = np.arange(len(text))  # per character of the current text, its offset
        current = text
        for _ in range(MAX_CUT_ROUNDS):
            found = self._hit_spans(current)
            if found is None:
                return None
            if not found:
                return cuts
            new = [(int(kept[s]), int(kept[e - 1]) + 1, d) for s, e, d in found]
            labelled = cuts + new
            merged = _merge([(s, e, k) for k, (s, e, _) in enumerate(labelled)])
            cuts = [(s, e, labelled[k][2]) for s, e, k in merged]
            mask = np.ones(len(text), dtype=bool)
            for s, e, _ in cuts:
                mask[s:e] = False
            kept = np.flatnonzero(mask)
            current = "".join(text[s:e] for s, e in _gaps(cuts, len(text)))
        return None

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            found = self.match(doc.text)
            if found is None:
                yield doc
            elif self.mode == "remove":
                detail = self._detail(*found)
                self.reject(doc, f"contaminated:{detail['eval_set']}",
                            detail=json.dumps(detail))
            else:
                yield from self._cut_document(doc, self._detail(*found))

    def _cut_document(self, doc: Document, first: dict[str, str]) -> Iterator[Document]:
        """``doc`` with its matching spans cut out and recorded, or nothing (removed)."""
        cuts = self.cut(doc.text)
        if cuts is None:
            self.reject(doc, f"contaminated:{first['eval_set']}", detail=json.dumps(first))
            return
        text = "".join(doc.text[s:e] for s, e in _gaps(cuts, len(doc.text)))
        short = self._length.reason(Document(doc.key, doc.source, text))
        if short in ("too_few_chars", "too_few_words"):
            detail = {**cuts[0][2], "left": len(text)}
            self.reject(doc, f"contaminated:{cuts[0][2]['eval_set']}:{short}",
                        detail=json.dumps(detail))
            return
        for s, e, d in cuts:
            self.extra[d["eval_set"]] += 1
            if self.sink is not None:
                self.sink(Rejection(
                    key=doc.key, source=doc.source, stage=self.name,
                    reason=f"{self.name}:edit:{d['eval_set']}", text=doc.text[s:e],
                    detail=json.dumps({"start": s, "end": e, "replacement": "", **d})))
        doc.text = text
        yield doc


def _gaps(cuts: list[tuple[int, int, Any]], size: int) -> Iterator[tuple[int, int]]:
    """The ``[start, end)`` spans of ``[0, size)`` outside the sorted disjoint ``cuts``."""
    at = 0
    for s, e, _ in cuts:
        if s > at:
            yield at, s
        at = e
    if at < size:
        yield at, size
