"""The one shape of every curation stage (after datatrove's ``PipelineStep``).

A stage is a small class holding its config, with one ``run`` over a stream of
:class:`Document`. Calling the stage wraps ``run`` with counters (documents in, out,
rejected by reason) and wall time. A document a stage removes is never silently
dropped: the stage calls :meth:`PipelineStep.reject`, which counts it and hands it to
the quarantine sink with the stage name and reason.

The two cross-document stages (exact and fuzzy dedup) have the same small shape,
:class:`GlobalStep`: a name, a version, a config and its fingerprint, plus per-block
columns and a decision over all blocks. The stage list itself is
:data:`tokenmill.pipeline.run.stage_list.STAGES`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class Document:
    """One document flowing through the stages.

    ``key`` is stable and unique within a datamix: ``source/relative/file#row`` with the
    row zero-padded, so that sorting keys gives the input order.
    """

    key: str
    source: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rejection:
    """A removed document as the quarantine stores it."""

    key: str
    source: str
    stage: str
    reason: str
    text: str | None = None
    raw: bytes | None = None
    duplicate_of: str | None = None
    detail: str | None = None


@dataclass
class StepStats:
    docs_in: int = 0
    docs_out: int = 0
    rejected: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def merge(self, other: StepStats) -> None:
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.rejected.update(other.rejected)
        self.seconds += other.seconds

    def to_dict(self) -> dict[str, Any]:
        return {"docs_in": self.docs_in, "docs_out": self.docs_out,
                "rejected": dict(sorted(self.rejected.items()))}


class PipelineStep:
    """Base class of a stage. Subclasses set ``name`` and ``version`` and implement
    :meth:`run`; their constructor keyword arguments are their config.

    ``version`` is part of the stage's content address: bump it when the stage's
    output for the same input changes, so that stale cached outputs are not reused.
    """

    name: ClassVar[str] = "step"
    version: ClassVar[int] = 1

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)
        self.stats = StepStats()
        self.sink: Callable[[Rejection], None] | None = None

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:  # pragma: no cover
        raise NotImplementedError

    def reject(self, doc: Document, reason: str, **extra: Any) -> None:
        """Count ``doc`` as removed for ``reason`` and send it to the quarantine sink."""
        self.stats.rejected[reason] += 1
        if self.sink is not None:
            self.sink(Rejection(key=doc.key, source=doc.source, stage=self.name,
                                reason=reason, text=doc.text, **extra))

    def __call__(self, docs: Iterable[Document]) -> Iterator[Document]:
        def counted_in() -> Iterator[Document]:
            for d in docs:
                self.stats.docs_in += 1
                yield d

        it = self.run(counted_in())
        while True:
            t0 = time.perf_counter()
            try:
                d = next(it)
            except StopIteration:
                self.stats.seconds += time.perf_counter() - t0
                return
            self.stats.seconds += time.perf_counter() - t0
            self.stats.docs_out += 1
            yield d

    def fingerprint(self) -> str:
        """sha256 of (name, version, config): the stage's part of a content address."""
        blob = json.dumps([self.name, self.version, self.config], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


class DocumentFilter(PipelineStep):
    """A stage that keeps or removes each document independently.

    Subclasses implement :meth:`reason`: ``None`` keeps the document, a string names why
    it is removed (that string is the counter and quarantine reason).
    """

    def reason(self, doc: Document) -> str | None:  # pragma: no cover
        raise NotImplementedError

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            why = self.reason(doc)
            if why is None:
                yield doc
            else:
                self.reject(doc, why)


class GlobalStep:
    """The shape of a cross-document stage (exact and fuzzy dedup).

    Three phases:

    1. :meth:`block_columns` on the workers, per block: the per-document columns the
       decision needs (a content hash, a MinHash signature), stored with the block;
    2. the decision over all blocks in the global document order, in hash partitions
       (:mod:`tokenmill.pipeline.dedup.partitioned`): per block, ``{removed key: [kept
       key, stage, detail]}``, and a record for the manifest (or None);
    3. the removal itself happens per block before tokenization, with quarantine rows
       ``stage=name``, ``reason=f"{name}:duplicate"``, ``duplicate_of`` = kept key.

    Subclasses set ``name``, ``version`` and ``columns`` (the names :meth:`block_columns`
    returns); their constructor keyword arguments are their config.
    """

    name: ClassVar[str] = "global"
    version: ClassVar[int] = 1
    columns: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:  # pragma: no cover
        """Per-document columns (pyarrow arrays, one value per document of ``docs``)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """sha256 of (name, version, config): the stage's part of a content address."""
        blob = json.dumps([self.name, self.version, self.config], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()
