"""Decontamination: documents that share an n-gram of normalized words with an eval set
are removed (GPT-3's 13-gram overlap, Brown et al. 2020; the rules of datatrove's
``NGramsDecontFilter``: 12-grams of the label, optionally of the query, and those that
span query and label, see :mod:`tokenmill.pipeline.decont.text`).

The eval-set index is built once per datamix on the driver (:func:`build_kwargs`, content
addressed under ``<output>/work/decont``) and memory-mapped by each worker (a bucketed
sorted hash array: two memory reads an n-gram, whatever the eval sets' size). A removed
document is quarantined with reason ``contaminated:<eval set>`` (so the manifest and the
report count removals per eval set) and ``detail`` a JSON object with ``eval_set``,
``example_id`` and ``ngram`` (the first of the document's n-grams found in the index).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tokenmill.pipeline.config import DatamixConfig, SourceConfig
from tokenmill.pipeline.decont.index import contains, ensure_index, load_examples, load_index
from tokenmill.pipeline.decont.text import hash_strings, ngram_strings, normalized_words
from tokenmill.pipeline.stage import Document, DocumentStage


def build_kwargs(cfg: DatamixConfig, source: SourceConfig) -> dict[str, Any] | None:
    """The stage's constructor arguments (building the index if needed), or ``None``
    when the datamix has no ``decontamination``."""
    if cfg.decontamination is None:
        return None
    work = Path(cfg.output_dir or ".").resolve() / "work"
    index = ensure_index(cfg.decontamination.model_dump(), cfg.data_root, work)
    return {"index": index, "n": cfg.decontamination.n}


class Decontaminate(DocumentStage):
    """Remove documents sharing an ``n``-gram with the eval-set index at ``index``."""

    name = "decontaminate"
    version = 1

    def __init__(self, index: str, n: int = 12) -> None:
        super().__init__(index=index, n=n)
        self.n = n
        self._hashes: np.ndarray | None = None
        self._owners: np.ndarray | None = None
        self._buckets: np.ndarray | None = None
        self._examples: list[list[str]] | None = None

    def match(self, text: str) -> tuple[int, str] | None:
        """``(example number, n-gram)`` of the first of ``text``'s n-grams in the index,
        or ``None``."""
        if self._hashes is None:
            self._hashes, self._owners, self._buckets = load_index(self.config["index"])
        grams = ngram_strings(normalized_words(text), self.n)
        if not grams or not len(self._hashes):
            return None
        found = contains(self._hashes, self._buckets, hash_strings(grams))
        hits = np.flatnonzero(found >= 0)
        if not len(hits):
            return None
        first = int(hits[0])
        return int(self._owners[found[first]]), grams[first]

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            found = self.match(doc.text)
            if found is None:
                yield doc
                continue
            if self._examples is None:
                self._examples = load_examples(self.config["index"])
            eval_set, example_id = self._examples[found[0]]
            detail = {"eval_set": eval_set, "example_id": example_id, "ngram": found[1]}
            self.reject(doc, f"contaminated:{eval_set}", detail=json.dumps(detail))
