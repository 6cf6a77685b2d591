"""The curation stages, declared once, in order.

Everything that needs to know the stages reads :data:`STAGES` when it runs: the
executor (which stage runs where, and how each block's cache key is chained), the
manifest (per-stage counters and the per-source counts), the report (stage order) and
the CLI summary (through the manifest's counts). Adding a stage means a module holding
its class (:mod:`tokenmill.pipeline.document` for a per-document stage) and one
:class:`StageDef` line here; the tasks receive the stages as :class:`StageCall`, so a
Ray worker never looks a stage up by name.

Scopes, in the order they run:

``read``
    the rows of a unit's files, in blocks of ``block_documents`` (rows that cannot be
    read become quarantine rows, ``stage="read"``).
``document``
    a :class:`~tokenmill.pipeline.stage.DocumentStage` over one block's documents, on a
    Ray worker. ``build(cfg, source)`` gives its constructor arguments, or ``None`` when
    the stage does not run for that source.
``global``
    a :class:`~tokenmill.pipeline.stage.GlobalStage` (cross-document): per-block columns
    computed on the workers, then a decision over all blocks (which documents go).
``block``
    per block after the global decisions (tokenization: the tokenize task).
``source``
    per source, over its blocks in order (shard writing: the source task).

Every stage's version and config fingerprint are hashed into the cache key of its
per-block outputs, chained from the previous stage's key, so that changing one stage's
parameter recomputes exactly that stage and the ones after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from tokenmill import objectcache, storage
from tokenmill.pipeline.config import DatamixConfig, SourceConfig
from tokenmill.pipeline.dedup.exact import ExactDedup
from tokenmill.pipeline.dedup.fuzzy import MinHashDedup
from tokenmill.pipeline.dedup.span import SpanDedup
from tokenmill.pipeline.dedup.substring import SubstringDedup
from tokenmill.pipeline.document.classifier import ClassifierFilter
from tokenmill.pipeline.document.classifier_top import ClassifierTopFraction
from tokenmill.pipeline.document.decontaminate import Decontaminate, build_kwargs
from tokenmill.pipeline.document.language import LanguageFilter
from tokenmill.pipeline.document.length import LengthFilter
from tokenmill.pipeline.document.pii import PIIRedact
from tokenmill.pipeline.document.quality import build_quality_filter
from tokenmill.pipeline.document.url_filter import URLFilter, cached_files_digest
from tokenmill.pipeline.read.license import DocumentLicenseGate
from tokenmill.pipeline.read.normalize import Normalize
from tokenmill.pipeline.read.remote_file import is_url, local_copy
from tokenmill.pipeline.run.shard_writer import WriteShards
from tokenmill.pipeline.run.tokenize import Tokenize
from tokenmill.pipeline.stage import Configured

Scope = Literal["read", "document", "global", "block", "source"]
#: SourceCounts fields a stage's removals are counted in (manifest ``counts``)
CountsField = Literal["quarantined", "license_rejected", "filtered", "exact_duplicates",
                      "near_duplicates"]

Build = Callable[[DatamixConfig, SourceConfig], "dict[str, Any] | None"]


@dataclass(frozen=True)
class StageDef:
    """One stage of the pipeline.

    Attributes:
        name: the stage's name (manifest ``stages`` key, quarantine ``stage``, ``work/``
            folder).
        scope: where it runs (see the module docstring).
        make: constructor of the stage object from its config keyword arguments.
        build: ``(datamix config, source config) -> constructor kwargs``, or ``None`` when
            the stage is off (for that source).
        counts: the ``SourceCounts`` field its removals add to (``None``: it removes
            nothing).
        strip_prefix: removal reasons lose this prefix in ``counts``
            (``"license:cc-by-nc-4.0"`` -> ``"cc-by-nc-4.0"``).
        extra_field: a ``SourceEntry`` field the stage's extra counters go to.
        in_manifest: whether the manifest's ``stages`` records it.
        metadata: per-document metadata the stage sets, as ``(column, pyarrow type)``:
            carried to the shard sidecars (in stage order) whenever the stage runs.
        cuts: whether the stage cuts spans out of the documents it keeps (edit records
            in the quarantine; a line in the run's summary).
    """

    name: str
    scope: Scope
    make: Callable[..., Any] | None = None
    build: Build | None = None
    counts: CountsField | None = None
    strip_prefix: str = ""
    extra_field: str | None = None
    in_manifest: bool = True
    metadata: tuple[tuple[str, pa.DataType], ...] = ()
    cuts: bool = False

    def kwargs(self, cfg: DatamixConfig, source: SourceConfig) -> dict[str, Any] | None:
        """The stage's constructor arguments for ``source``, or ``None`` if it is off."""
        return self.build(cfg, source) if self.build is not None else {}

    def instance(self, kwargs: dict[str, Any]) -> Configured:
        """A new stage object (``make(**kwargs)``)."""
        if self.make is None:
            raise ValueError(f"stage {self.name!r} has no stage object")
        return self.make(**kwargs)


def _license(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    return {"deny_terms": sorted(cfg.licenses.document_deny_terms)} \
        if src.document_license else None


def _quality(name: str) -> Build:
    def build(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
        if not src.quality_filters or cfg.quality is None:
            return None
        kw = getattr(cfg.quality, name)
        return None if kw is None else dict(kw)
    return build


def _language(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    if cfg.language is None:
        return None
    lang = cfg.language.model_dump()
    if not src.quality_filters:
        lang["languages"] = None  # label only
    return lang


def _url_filter(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    uf = cfg.url_filter
    if uf is None or src.url_field is None:
        return None
    kw: dict[str, Any] = {k: [cfg.resolve(p) for p in getattr(uf, k)]
                          for k in ("domains", "urls", "banned_words", "banned_subwords",
                                    "soft_banned_words")}
    archive = cfg.resolve(uf.archive) if uf.archive else None
    files = [*([archive] if archive else []), *(p for v in kw.values() for p in v)]
    digest = cached_files_digest(files)
    names = ("domains", "urls", "banned_words", "banned_subwords", "soft_banned_words")
    shared = iter(_for_nodes(cfg, files, digest))
    if archive:
        archive = next(shared)
    kw = {k: [next(shared) for _ in kw[k]] for k in names}
    return {**kw, "archive": archive, "categories": uf.categories,
            "soft_word_threshold": uf.soft_word_threshold, "digest": digest}


def _for_sources(key: str) -> Build:
    def build(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
        stage = getattr(cfg, key)
        if stage is None or (stage.sources is not None and src.name not in stage.sources):
            return None
        return {k: v for k, v in stage.model_dump(exclude={"sources"}).items()
                if v is not None}
    return build


def _local_work(cfg: DatamixConfig) -> Path:
    """This node's ``work/`` folder of the run (for an object-store output: in staging)."""
    return storage.local_dir(storage.normalize(cfg.output_dir or ".")) / "work"


def _for_nodes(cfg: DatamixConfig, paths: list[str], digest: str) -> list[str]:
    """Local files of the driver that the workers read, as every node reaches them:
    unchanged for a local output (its nodes share the driver's files); for an output in
    an object store, committed once to ``OUT/work/inputs/<digest>/`` (``digest``: of
    their bytes) and named by their URLs there, which each node copies for itself."""
    out = storage.normalize(cfg.output_dir or ".")
    if not storage.is_url(out) or not paths:
        return paths
    url = storage.join(out, "work", "inputs", digest[:32])
    names = [f"{i}-{Path(p).name}" for i, p in enumerate(paths)]
    objectcache.commit_files(dict(zip(names, paths, strict=True)), url)
    return [storage.join(url, n) for n in names]


def _classifier(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    kw = _for_sources("classifier")(cfg, src)
    if kw is None:
        return None
    model = kw["model"]
    model = (local_copy(model, _local_work(cfg) / "downloads", "classifier model")
             if is_url(model) else cfg.resolve(model))
    kw.pop("top_fraction", None)  # a global decision (classifier_top): here, scores only
    digest = cached_files_digest([model])
    return {**kw, "model": _for_nodes(cfg, [model], digest)[0], "digest": digest}


def _classifier_top(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    c = cfg.classifier
    if _classifier(cfg, src) is None or c is None or c.top_fraction is None:
        return None
    return {"top_fraction": c.top_fraction}


def _fuzzy(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    return cfg.fuzzy_dedup.model_dump() if cfg.fuzzy_dedup is not None else None


def _substring(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    sd = cfg.substring_dedup
    if sd is None:
        return None
    return {**sd.model_dump(), "tokenizer": cfg.tokenizer,
            "filters": cfg.filters.model_dump()}


def _span(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any] | None:
    sd = cfg.span_dedup
    if sd is None:
        return None
    window = sd.n_sentences if sd.mode == "sentences" else sd.n_paragraphs
    return {"mode": sd.mode, "window": window, "min_doc_words": sd.min_doc_words,
            "min_num_sentences": sd.min_num_sentences, "filters": cfg.filters.model_dump()}


def _shards(cfg: DatamixConfig, src: SourceConfig) -> dict[str, Any]:
    sh = cfg.shards
    return {"tokens_per_shard": sh.tokens_per_shard, "val_fraction": sh.val_fraction,
            "min_val_documents": src.min_val_documents,
            "default_min_val_documents": sh.min_val_documents,
            "min_val_source_documents": sh.min_val_source_documents}


def _quality_stage(name: str) -> StageDef:
    return StageDef(name, "document", lambda **kw: build_quality_filter(name, **kw),
                    _quality(name), counts="filtered")


STAGES: tuple[StageDef, ...] = (
    StageDef("read", "read", counts="quarantined"),
    StageDef("license", "document", DocumentLicenseGate, _license, counts="license_rejected",
             strip_prefix="license:", extra_field="license_accepted",
             metadata=(("license", pa.string()),)),
    StageDef("normalize", "document", Normalize, lambda c, s: {}, counts="quarantined"),
    StageDef("url_filter", "document", URLFilter, _url_filter, counts="filtered"),
    StageDef("length", "document", LengthFilter, lambda c, s: c.filters.model_dump(),
             counts="filtered"),
    _quality_stage("gopher_quality"),
    _quality_stage("gopher_repetition"),
    _quality_stage("c4"),
    _quality_stage("fineweb"),
    StageDef("language", "document", LanguageFilter, _language, counts="filtered",
             metadata=(("language", pa.string()), ("language_score", pa.float32()))),
    StageDef("classifier", "document", ClassifierFilter, _classifier, counts="filtered",
             metadata=(("classifier_score", pa.float32()),)),
    # before PII: eval text holds real addresses, and a placeholder breaks its n-grams
    StageDef("decontaminate", "document", Decontaminate, build_kwargs, counts="filtered",
             extra_field="decontamination_cuts", cuts=True),
    StageDef("pii", "document", PIIRedact, _for_sources("pii"), extra_field="pii_replacements"),
    StageDef("exact_dedup", "global", ExactDedup, lambda c, s: {}, counts="exact_duplicates"),
    StageDef("fuzzy_dedup", "global", MinHashDedup, _fuzzy, counts="near_duplicates"),
    StageDef("classifier_top", "global", ClassifierTopFraction, _classifier_top,
             counts="filtered"),
    StageDef("substring_dedup", "global", SubstringDedup, _substring, counts="filtered",
             cuts=True),
    # last: it leaves out what substring_dedup's edits cut (both see the prepared text)
    StageDef("span_dedup", "global", SpanDedup, _span, counts="filtered", cuts=True),
    StageDef("tokenize", "block", Tokenize,
             lambda c, s: {"tokenizer": c.tokenizer_for_stage(),
                          "val_fraction": c.shards.val_fraction},
             in_manifest=False),
    StageDef("shards", "source", WriteShards, _shards, in_manifest=False),
)

def of_scope(scope: Scope) -> list[StageDef]:
    """The stages of one scope, in pipeline order."""
    return [s for s in STAGES if s.scope == scope]


def cut_lines(edits: dict[str, dict[str, int]]) -> list[str]:
    """One line per stage that :attr:`StageDef.cuts` and ran: the spans it cut out of the
    kept documents and how many documents lost spans. ``edits``: per stage name
    ``{"spans", "documents"}`` (``RunResult.edits``); a stage absent cut nothing."""
    return [f"{s.name}: {c.get('spans', 0):,} spans cut out of {c.get('documents', 0):,} "
            "kept documents" for s in STAGES if s.cuts and (c := edits.get(s.name))]


def stage_order() -> tuple[str, ...]:
    """Stage names in pipeline order, as the manifest's ``stages`` and the report name
    them (``read_errors`` is the read stage's removals)."""
    names: list[str] = []
    for s in STAGES:
        if s.in_manifest:
            names += ["read", "read_errors"] if s.scope == "read" else [s.name]
    return tuple(names)


@dataclass(frozen=True)
class StageCall:
    """A stage as a task receives it: its definition and its constructor arguments
    (picklable; the task builds the stage object once, :meth:`build`)."""

    stage: StageDef
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.stage.name

    def build(self) -> Any:
        """A new stage object."""
        return self.stage.instance(self.kwargs)


def calls(cfg: DatamixConfig, source: SourceConfig, scope: Scope) -> tuple[StageCall, ...]:
    """The stages of ``scope`` that run for ``source``, in order."""
    out = []
    for s in of_scope(scope):
        kw = s.kwargs(cfg, source)
        if kw is not None:
            out.append(StageCall(s, kw))
    return tuple(out)


def metadata_columns(names: list[str] | None = None) -> list[tuple[str, pa.DataType]]:
    """``(column, type)`` of the per-document metadata the stages called ``names`` set
    (all stages when None), in stage order."""
    return [m for s in STAGES if names is None or s.name in names for m in s.metadata]


def metadata_names() -> tuple[str, ...]:
    """The per-document metadata columns of all stages, in stage order: what the shard
    sidecars carry (among those a block holds)."""
    return tuple(c for c, _ in metadata_columns())
