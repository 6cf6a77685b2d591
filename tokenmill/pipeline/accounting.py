"""Per-source counts and per-stage counters of the manifest, derived from the stage list.

Each :class:`~tokenmill.pipeline.stages.StageDef` says which ``SourceCounts`` field its
removals go to (``counts``), and whether the manifest's ``stages`` records it; nothing
here names a stage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tokenmill.manifests.schema import ShardEntry, SourceCounts, SourceEntry
from tokenmill.pipeline.sources import ResolvedSource
from tokenmill.pipeline.stages import STAGES, StageDef


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
    aggs = {s.name: _Agg() for s in STAGES}
    read = kept = 0
    for p, t in blocks:
        read += p["read"]
        kept += t["kept"]
        for name, st in p["stages"].items():
            aggs[name].add(st)
        for name, n in t["removed"].items():
            aggs[name].add({"rejected": {name: n}})
    return read, kept, aggs


def _manifest_stages(read: int, aggs: dict[str, _Agg]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for s in STAGES:
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
    for s in STAGES:
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
    extra_stages: list[StageDef] = [s for s in STAGES if s.extra_field]
    return {s.extra_field: dict(sorted(aggs[s.name].extra.items()))  # type: ignore[misc]
            for s in extra_stages}


def source_entry(src: ResolvedSource, blocks: list[tuple[dict, dict]],
                 written: dict[str, Any]) -> SourceEntry:
    """The manifest entry of one source.

    Args:
        src: the source.
        blocks: its blocks in order, each ``(prepare info, tokenize info)``.
        written: what its shard-writing task returned (``shards``).

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
        shards=shards, skipped_files=src.skipped_files,
        stages=_manifest_stages(read, aggs))
