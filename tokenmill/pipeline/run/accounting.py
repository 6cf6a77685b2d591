"""Per-source counts and per-stage counters of the manifest, derived from the stage list,
and the warnings of a run.

Each :class:`~tokenmill.pipeline.run.stage_list.StageDef` says which ``SourceCounts`` field its
removals go to (``counts``), and whether the manifest's ``stages`` records it; nothing
here names a stage.

Warnings (:func:`source_warnings`): nothing is silent. A data file that yields no
document, a source that keeps none, and a source with more of its rows quarantined than
``checks.max_quarantine_share`` are each one line in the manifest's ``warnings``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tokenmill.manifests.schema import (
    CurationWarning,
    InputFile,
    ShardEntry,
    SourceCounts,
    SourceEntry,
    ValidationSplit,
)
from tokenmill.pipeline.read.readers import printable_name
from tokenmill.pipeline.read.sources import ResolvedSource
from tokenmill.pipeline.run import stage_list
from tokenmill.pipeline.run.stage_list import StageDef


@dataclass
class _Agg:
    """Counters of one stage summed over a source's blocks."""

    ran: bool = False
    docs_in: int = 0
    docs_out: int = 0
    rejected: Counter = field(default_factory=Counter)
    extra: Counter = field(default_factory=Counter)

    def add(self, st: dict[str, Any]) -> None:
        self.ran = True
        self.docs_in += st.get("docs_in", 0)
        self.docs_out += st.get("docs_out", 0)
        self.rejected.update(st.get("rejected", {}))
        self.extra.update(st.get("extra", {}))


def _aggregate(blocks: list[tuple[dict, dict]]) -> tuple[int, int, dict[str, _Agg]]:
    """(rows read, documents kept, per stage name its counters) over ``blocks``, each
    ``(prepare info, tokenize info)``."""
    aggs = {s.name: _Agg() for s in stage_list.STAGES}
    cutting = {s.name for s in stage_list.STAGES if s.cuts}
    read = kept = 0
    for p, t in blocks:
        read += p["read"]
        kept += t["kept"]
        for name, st in p["stages"].items():
            aggs[name].add(st)
        for name, n in t["removed"].items():
            aggs[name].add({"rejected": {name: n}})
        # the cuts of documents a global stage removed later count no more
        for name, edits in t.get("removed_edits", {}).items():
            if name not in cutting:
                continue
            extra = aggs[name].extra
            extra.subtract(edits)
            for what in [w for w in edits if extra[w] <= 0]:
                del extra[what]
    return read, kept, aggs


def _manifest_stages(read: int, aggs: dict[str, _Agg]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for s in stage_list.STAGES:
        a = aggs[s.name]
        if not s.in_manifest:
            continue
        if s.scope == "read":
            out["read"] = {"rows": read}
            out["read_errors"] = {"removed": sum(a.rejected.values())}
        elif s.scope == "global":
            out[s.name] = {"removed": sum(a.rejected.values())}
        elif a.ran:
            out[s.name] = {"docs_in": a.docs_in, "docs_out": a.docs_out,
                           "rejected": dict(sorted(a.rejected.items()))}
    return out


def _counts(read: int, kept: int, aggs: dict[str, _Agg]) -> SourceCounts:
    fields: dict[str, Any] = {"read": read, "kept": kept}
    for s in stage_list.STAGES:
        if s.counts is None:
            continue
        rejected = aggs[s.name].rejected
        if isinstance(SourceCounts.model_fields[s.counts].default, int):
            fields[s.counts] = fields.get(s.counts, 0) + sum(rejected.values())
        else:
            into = fields.setdefault(s.counts, Counter())
            into.update({k.removeprefix(s.strip_prefix): v for k, v in rejected.items()})
    return SourceCounts(**{k: dict(sorted(v.items())) if isinstance(v, Counter) else v
                           for k, v in fields.items()})


def _extras(aggs: dict[str, _Agg]) -> dict[str, dict[str, int]]:
    extra_stages: list[StageDef] = [s for s in stage_list.STAGES if s.extra_field]
    return {s.extra_field: dict(sorted(aggs[s.name].extra.items()))  # type: ignore[misc]
            for s in extra_stages}


def source_entry(src: ResolvedSource, blocks: list[tuple[dict, dict]],
                 written: dict[str, Any], files: list[InputFile] | None = None) -> SourceEntry:
    """The manifest entry of one source.

    Args:
        src: the source.
        blocks: its blocks in order, each ``(prepare info, tokenize info)``.
        written: what its shard-writing task returned (``shards``, ``validation``).
        files: its data files with size and sha256.

    Raises:
        AssertionError: rows read != kept + removed (a stage lost count of a document).
    """
    read, kept, aggs = _aggregate(blocks)
    counts = _counts(read, kept, aggs)
    assert counts.read == counts.kept + counts.removed(), f"count mismatch for {src.name}"
    shards = [ShardEntry(**s) for s in written["shards"]]
    splits = ("train", "val")
    return SourceEntry(
        name=src.name, origin=src.origin, revision=src.revision, license=src.license,
        mixture_weight=src.config.weight, counts=counts, **_extras(aggs),
        tokens={s: sum(x.tokens for x in shards if x.split == s) for s in splits},
        documents={s: sum(x.documents for x in shards if x.split == s) for s in splits},
        shards=shards, skipped_files=src.skipped_files, files=files or [],
        validation=ValidationSplit(**written.get("validation", {})),
        stages=_manifest_stages(read, aggs))


def file_documents(files: list[str], prepare_infos: list[dict[str, Any]]
                   ) -> dict[str, dict[str, Any]]:
    """Per data file of a source (``files``, in order, by printable name): ``{"docs":
    documents it yields, "rejected": {reason: rows quarantined (by the reader or
    normalization)}}``, summed over its blocks' prepare infos (their ``files``)."""
    out: dict[str, dict[str, Any]] = {printable_name(f): {"docs": 0, "rejected": Counter()}
                                      for f in files}
    for info in prepare_infos:
        for rel, c in info.get("files", {}).items():
            agg = out.setdefault(rel, {"docs": 0, "rejected": Counter()})
            agg["docs"] += c["docs"]
            agg["rejected"].update(c["rejected"])
    return out


def _reasons(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))


def source_warnings(entry: SourceEntry, files: dict[str, dict[str, Any]],
                    max_quarantine_share: float) -> list[CurationWarning]:
    """The warnings of one source: each file that yields no document, the source keeping
    no document, and the source's quarantined share over ``max_quarantine_share``.

    Args:
        entry: the source's manifest entry.
        files: :func:`file_documents` of the source.
        max_quarantine_share: in [0, 1], of the rows read.
    """
    name, c = entry.name, entry.counts
    out = []
    for rel, f in files.items():
        if f["docs"] <= 0:
            rows = sum(f["rejected"].values())
            why = f"every row quarantined: {_reasons(f['rejected'])}" if rows else "no rows"
            out.append(CurationWarning(
                kind="empty_file", source=name, file=rel,
                message=f"source {name!r}: file {rel} yields no document ({why})"))
    if c.kept == 0:
        removed = {SourceCounts.model_fields[k].title or k: c.removed_by(k)
                   for k in SourceCounts.removal_fields() if c.removed_by(k)}
        out.append(CurationWarning(
            kind="empty_source", source=name,
            message=f"source {name!r} keeps 0 of {c.read} documents"
                    + (f" (removed: {_reasons(removed)})" if removed else "")))
    quarantined = sum(c.quarantined.values())
    if c.read and quarantined / c.read > max_quarantine_share:
        out.append(CurationWarning(
            kind="quarantine_share", source=name,
            message=f"source {name!r}: {quarantined} of {c.read} rows quarantined "
                    f"({quarantined / c.read:.0%}, over checks.max_quarantine_share "
                    f"{max_quarantine_share:.0%}): {_reasons(c.quarantined)}"))
    return out
