"""The end-of-run summary table (per source: documents in, removed by reason, kept, tokens)."""

from __future__ import annotations

import re

from tokenmill.manifests.schema import DatamixManifest


def _fmt_reasons(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def summary_table(m: DatamixManifest) -> str:
    """A plain-text table of the manifest's per-source counts and tokens."""
    rows = [("source", "license", "docs in", "quarantined", "license rej.", "exact dups",
             "near dups", "filtered", "kept", "train tokens", "val tokens", "shards")]
    tot = [0] * 9
    for s in m.sources:
        c = s.counts
        vals = [c.read, sum(c.quarantined.values()), sum(c.license_rejected.values()),
                c.exact_duplicates, c.near_duplicates, sum(c.filtered.values()), c.kept,
                s.tokens["train"], s.tokens["val"]]
        tot = [a + b for a, b in zip(tot, vals, strict=True)]
        rows.append((s.name, s.license, *map(str, vals), str(len(s.shards))))
    rows.append(("TOTAL", "", *map(str, tot), str(sum(len(s.shards) for s in m.sources))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths, strict=True))))
        if j == 0 or j == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    details = []
    for s in m.sources:
        c = s.counts
        parts = []
        if c.quarantined:
            parts.append(f"quarantined: {_fmt_reasons(c.quarantined)}")
        if c.license_rejected:  # by family (version and jurisdiction dropped); full in manifest
            fam: dict[str, int] = {}
            for lic, n in c.license_rejected.items():
                f = re.sub(r"-\d+(\.\d+)*(-[a-z]+)?$", "", lic)
                fam[f] = fam.get(f, 0) + n
            parts.append(f"license rejected: {_fmt_reasons(dict(sorted(fam.items())))}")
        if c.filtered:
            parts.append(f"filtered: {_fmt_reasons(c.filtered)}")
        if parts:
            details.append(f"  {s.name}: " + "; ".join(parts))
    if details:
        lines += ["", "removed by reason:", *details]
    return "\n".join(lines)
