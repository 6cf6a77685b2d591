"""The end-of-run summary table (per source: documents in, removed by reason, kept, tokens).

Its count columns are the fields of :class:`~tokenmill.manifests.schema.SourceCounts`
(titled by each field's ``title``), so a new kind of removal shows up here by being a
field there.
"""

from __future__ import annotations

import re

from tokenmill.manifests.schema import DatamixManifest, SourceCounts


def _fmt_reasons(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def _license_families(d: dict[str, int]) -> dict[str, int]:
    """Licenses by family (version and jurisdiction dropped); the full ids are in the
    manifest."""
    fam: dict[str, int] = {}
    for lic, n in d.items():
        f = re.sub(r"-\d+(\.\d+)*(-[a-z]+)?$", "", lic)
        fam[f] = fam.get(f, 0) + n
    return dict(sorted(fam.items()))


def _table_rows(m: DatamixManifest) -> list[tuple[str, ...]]:
    fields = SourceCounts.model_fields
    counts = ["read", *SourceCounts.removal_fields(), "kept"]
    rows = [("source", "license", *(fields[f].title or f for f in counts),
             "train tokens", "val tokens", "shards")]
    tot = [0] * (len(counts) + 2)
    for s in m.sources:
        vals = [s.counts.removed_by(f) for f in counts] + [s.tokens["train"], s.tokens["val"]]
        tot = [a + b for a, b in zip(tot, vals, strict=True)]
        rows.append((s.name, s.license, *map(str, vals), str(len(s.shards))))
    rows.append(("TOTAL", "", *map(str, tot), str(sum(len(s.shards) for s in m.sources))))
    return rows


def _reason_details(m: DatamixManifest) -> list[str]:
    labelled = [(f, info.json_schema_extra) for f, info in SourceCounts.model_fields.items()
                if isinstance(info.json_schema_extra, dict)]
    details = []
    for s in m.sources:
        parts = []
        for f, extra in labelled:
            reasons = getattr(s.counts, f)
            if reasons:
                if extra.get("by_family"):
                    reasons = _license_families(reasons)
                parts.append(f"{extra['reason_label']}: {_fmt_reasons(reasons)}")
        if parts:
            details.append(f"  {s.name}: " + "; ".join(parts))
    return details


def summary_table(m: DatamixManifest) -> str:
    """A plain-text table of the manifest's per-source counts and tokens, then the removal
    reasons per source."""
    rows = _table_rows(m)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths, strict=True))))
        if j == 0 or j == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    details = _reason_details(m)
    if details:
        lines += ["", "removed by reason:", *details]
    return "\n".join(lines)
