"""The end-of-run summary table (per source: documents in, removed by reason, kept, tokens,
warnings), then the removal reasons and the run's warnings, one line each.

Its count columns are the fields of :class:`~tokenmill.manifests.schema.SourceCounts`
(titled by each field's ``title``), so a new kind of removal shows up here by being a
field there.
"""

from __future__ import annotations

import re

from tokenmill.manifests.schema import DatamixManifest, SourceCounts


def _fmt_reasons(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def license_family(lic: str) -> str:
    """A license id's family: version and jurisdiction dropped
    (``cc-by-nc-sa-3.0-es`` -> ``cc-by-nc-sa``)."""
    return re.sub(r"-\d+(\.\d+)*(-[a-z]+)?$", "", lic)


def license_families(d: dict[str, int]) -> dict[str, int]:
    """Counts by license id summed by :func:`license_family`, sorted by family; the full
    ids are in the manifest."""
    fam: dict[str, int] = {}
    for lic, n in d.items():
        f = license_family(lic)
        fam[f] = fam.get(f, 0) + n
    return dict(sorted(fam.items()))


def _table_rows(m: DatamixManifest) -> list[tuple[str, ...]]:
    fields = SourceCounts.model_fields
    counts = ["read", *SourceCounts.removal_fields(), "kept"]
    rows = [("source", "license", *(fields[f].title or f for f in counts),
             "train tokens", "val tokens", "shards", "warnings")]
    tot = [0] * (len(counts) + 2)
    for s in m.sources:
        vals = [s.counts.removed_by(f) for f in counts] + [s.tokens["train"], s.tokens["val"]]
        tot = [a + b for a, b in zip(tot, vals, strict=True)]
        warned = sum(1 for w in m.warnings if w.source == s.name)
        rows.append((s.name, s.license, *map(str, vals), str(len(s.shards)),
                     str(warned) if warned else "-"))
    rows.append(("TOTAL", "", *map(str, tot), str(sum(len(s.shards) for s in m.sources)),
                 str(len(m.warnings)) if m.warnings else "-"))
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
                    reasons = license_families(reasons)
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
    if m.warnings:
        lines += ["", f"warnings ({len(m.warnings)}; each is an error, exit 2, under "
                      "`tokenmill run --strict`):", *(f"  WARNING {w.message}" for w in m.warnings)]
    return "\n".join(lines)
