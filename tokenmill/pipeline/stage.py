"""The two shapes of a curation stage (after datatrove's ``PipelineStep``): one for
per-document stages, one for cross-document (global) stages.

Every stage is a small class holding its config (its constructor's keyword arguments),
with a ``name`` and a ``version`` that, with the config, make its :meth:`fingerprint`
(its part of the content address of what it produces). The stage list that the
executor runs is :data:`tokenmill.pipeline.run.stage_list.STAGES`; nothing outside a
stage's own module names it.

:class:`DocumentStage`
    one ``run`` over a stream of :class:`Document`, on a Ray worker, per block. Calling
    the stage wraps ``run`` with counters (documents in, out, rejected by reason) and
    wall time. A document a stage removes is never silently dropped: the stage calls
    :meth:`DocumentStage.reject`, which counts it and hands it to the quarantine sink
    with the stage name and reason. :class:`DocumentFilter` is the common case (a reason
    or ``None`` per document).
:class:`GlobalStage`
    per-document columns computed per block on the workers (:meth:`GlobalStage.block_columns`,
    stored with the prepared block), then one :meth:`GlobalStage.decide` over all blocks
    in the global document order, which may start Ray tasks of its own and returns a
    :class:`GlobalDecision`: the removals of this and the earlier global stages, as
    files grouped by block (:mod:`tokenmill.pipeline.run.removals`), its edits of kept
    documents (spans cut from their text, recorded in the quarantine as edit records),
    and a manifest record. A removed document is quarantined with ``stage=name``,
    ``reason=f"{name}:duplicate"`` and ``duplicate_of`` the kept document's key.
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


#: in the reason of a quarantine row that records an edit of a kept document (its original
#: span in ``text``, where in ``detail``), not a removal: ``<stage>:edit:<what>``
EDIT_REASON_MARK = ":edit:"


def is_edit_reason(reason: str) -> bool:
    """Whether a quarantine reason records an edit (see :data:`EDIT_REASON_MARK`)."""
    return EDIT_REASON_MARK in reason


@dataclass
class Rejection:
    """A removed document as the quarantine stores it, or an edit record (a reason
    holding :data:`EDIT_REASON_MARK`) of a kept document."""

    key: str
    source: str
    stage: str
    reason: str
    text: str | None = None
    raw: bytes | None = None
    duplicate_of: str | None = None
    detail: str | None = None


@dataclass
class StageStats:
    """Counters of a document stage over the documents it saw."""

    docs_in: int = 0
    docs_out: int = 0
    rejected: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def merge(self, other: StageStats) -> None:
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.rejected.update(other.rejected)
        self.seconds += other.seconds

    def to_dict(self) -> dict[str, Any]:
        return {"docs_in": self.docs_in, "docs_out": self.docs_out,
                "rejected": dict(sorted(self.rejected.items()))}


class Configured:
    """A name, a version and a config (the constructor's keyword arguments), and their
    fingerprint.

    ``version`` is part of the content address of what the object produces: bump it when
    its output for the same input changes, so that stale cached outputs are not reused.
    ``how_cut`` names config keys that only cut the work (a part size): they are left out
    of the fingerprint, so that changing them reuses what was computed. A stage built from a
    datamix section takes them from its model (``config.outside_identity``), the fields the
    config's identity leaves out too.
    """

    name: ClassVar[str] = "stage"
    version: ClassVar[int] = 1
    how_cut: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)

    def fingerprint(self) -> str:
        """sha256 of (name, version, config): the object's part of a content address."""
        config = {k: v for k, v in self.config.items() if k not in self.how_cut}
        blob = json.dumps([self.name, self.version, config], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


class DocumentStage(Configured):
    """Base class of a per-document stage. Subclasses set ``name`` and ``version`` and
    implement :meth:`run`; their constructor keyword arguments are their config.

    Besides ``stats``, a stage may count in ``self.extra`` (a ``Counter``): extra counters
    the manifest records in the stage's ``extra_field`` (see
    :class:`~tokenmill.pipeline.run.stage_list.StageDef`).
    """

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.sink: Callable[[Rejection], None] | None = None
        self.reset_counters()

    def reset_counters(self) -> None:
        """Zero ``stats`` and ``extra`` (a task reuses one stage object for its blocks)."""
        self.stats = StageStats()
        self.extra: Counter = Counter()

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


class DocumentFilter(DocumentStage):
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


@dataclass(frozen=True)
class GlobalDecision:
    """What the global stages decided so far.

    Attributes:
        removals: the removal files of this and every earlier global stage, names
            relative to :attr:`GlobalContext.work`: partitioned files
            (:mod:`tokenmill.pipeline.run.partition_files`) grouped by block (partition
            ``i`` = block ``i``), columns of :data:`tokenmill.pipeline.run.removals.REMOVALS`.
            A document appears in at most one of them.
        record: the stage's manifest record (the manifest field of the stage's name), or
            None.
        same_text_by_hash: every removal's kept document has the removed one's text, and
            ``removals`` are ``parts`` files, file ``p`` holding the removals whose
            content hash (the blocks' ``hash`` column) falls in partition ``p`` (exact
            dedup's decision: a later stage may then re-point them).
        edits: this stage's own edit files (names relative to :attr:`GlobalContext.work`,
            grouped by block like ``removals``, columns of
            :data:`tokenmill.pipeline.run.removals.EDITS`): character spans cut from kept
            documents, applied before tokenization; a document that a stage removes
            loses its edits.
    """

    removals: tuple[str, ...] = ()
    record: dict[str, Any] | None = None
    same_text_by_hash: bool = False
    edits: tuple[str, ...] = ()


@dataclass(frozen=True)
class GlobalContext:
    """What :meth:`GlobalStage.decide` decides over.

    Attributes:
        work: folder of the global stages' files (``<output>/work/dedup``).
        prepare_work: folder of the prepared blocks (``<output>/work``).
        blocks: the prepared blocks' digests, in the global document order (source,
            unit, row); read their columns with
            :func:`~tokenmill.pipeline.run.prepare_task.read_block_columns`.
        parts: hash partitions of the decision (the datamix's ``dedup.partitions``).
        progress: show progress bars.
        earlier: the decision of the global stages before this one (None: it is the first).
        edits: the edit files of every global stage before this one (their
            :attr:`GlobalDecision.edits`, in stage order).
    """

    work: str
    prepare_work: str
    blocks: tuple[str, ...]
    parts: int
    progress: bool = False
    earlier: GlobalDecision | None = None
    edits: tuple[str, ...] = ()


class GlobalStage(Configured):
    """Base class of a cross-document stage. Subclasses set ``name``, ``version`` and
    ``columns`` (the names :meth:`block_columns` returns) and implement both methods;
    their constructor keyword arguments are their config.

    The decision must not depend on the number of Ray workers or on ``parts``, and must
    leave out the documents earlier global stages removed
    (:meth:`~tokenmill.pipeline.run.removals.Shuffle.removed_rows`).
    """

    columns: ClassVar[tuple[str, ...]] = ()

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:  # pragma: no cover
        """Per-document columns (pyarrow arrays, one value per document of ``docs``)."""
        raise NotImplementedError

    def decide(self, ctx: GlobalContext) -> GlobalDecision:  # pragma: no cover
        """The removals of this stage added to ``ctx.earlier``'s, and its manifest record."""
        raise NotImplementedError

    def with_kept_edits(self, record: dict[str, Any],
                        kept: dict[str, dict[str, int]]) -> dict[str, Any]:
        """``record`` (this stage's manifest record) with its ``spans`` and
        ``documents_edited``, in all and per source (``by_source``), counting only the
        documents that every global stage kept: ``kept`` maps source -> ``{"spans",
        "documents_edited"}`` of this stage's edits of those. A record without these
        counters is returned as it is."""
        if "spans" not in record or "documents_edited" not in record:
            return record
        names = ("spans", "documents_edited")
        out = {**record, **{n: sum(c.get(n, 0) for c in kept.values()) for n in names}}
        if "by_source" in record:
            out["by_source"] = {src: {**c, **{n: kept.get(src, {}).get(n, 0) for n in names}}
                                for src, c in record["by_source"].items()}
        return out
