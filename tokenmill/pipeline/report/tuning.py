"""The report's views for tuning filters: each rule's measure around its threshold, the
removal rates per source, and the license table cut to its largest rows.

Rule measures come from the per-block records the filters fill in the same pass
(:mod:`tokenmill.pipeline.document.measures`), stored by the run under
``work/measures/`` (:data:`MEASURES_DIR`, any ``*.json`` below it, one record per block).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenmill.pipeline.document.measures import RULES, read_records
from tokenmill.pipeline.report.plots import PlotSpec

MEASURES_DIR = Path("work") / "measures"
LICENSE_ROWS = 10


def rules_spec(out: Path, skipped: dict[str, str], measures: Path | None = None
               ) -> PlotSpec | None:
    """The ``rules`` plot (``rule_measures.png``) of the run in ``out`` (its records read
    from ``measures``, default ``out/work/measures``), or None (and a line in
    ``skipped``) when the run recorded no rule measures."""
    per_source = read_records(out / MEASURES_DIR if measures is None else measures)
    rules: list[dict[str, Any]] = []
    for rule, spec in RULES.items():  # filter order, rule order
        counts = {src: rec["histograms"][rule] for src, rec in per_source.items()
                  if rule in rec["histograms"] and sum(rec["histograms"][rule])}
        if not counts:
            continue
        thr = next(rec["thresholds"].get(rule, []) for src, rec in per_source.items()
                   if src in counts)
        rules.append({"rule": rule, "label": spec.label, "edges": spec.edges().tolist(),
                      "log": spec.log, "thresholds": thr, "removes": spec.removes,
                      "counts": counts})
    if not rules:
        skipped["rule_measures.png"] = ("no rule measures recorded (no filter with rule "
                                        f"measures ran; {MEASURES_DIR}/)")
        return None
    return PlotSpec("rule_measures.png", "Filter rules: measures and thresholds",
                    "For every filter rule, the histogram of its measure over each source's "
                    "documents that reached the rule (the earlier rules of the filter kept "
                    "them), the threshold dashed and the side it removes shaded. Values "
                    "beyond the axis are counted in the end bins.", "rules", {"rules": rules})


def removal_rates_by_source(stages: list[str], remaining: dict[str, list[int]],
                            rejected: dict[str, dict[str, dict[str, int]]],
                            label) -> dict[str, dict[str, float]]:
    """``{reason label: {source: share of that source's documents entering the stage
    that the reason removed}}``.

    Args:
        stages: the waterfall's columns (``read`` first, ``kept`` last).
        remaining: source -> documents remaining after each column.
        rejected: source -> stage -> reason -> documents (the manifest's stage counters;
            a stage without them counts as one reason named after the stage).
        label: ``(stage, reason) -> label`` (license reasons grouped by family).
    """
    out: dict[str, dict[str, float]] = {}
    for s_i, stage in enumerate(stages[1:-1], start=1):
        for src, rem in remaining.items():
            n_in = rem[s_i - 1]
            reasons = rejected.get(src, {}).get(stage)
            if reasons is None:
                reasons = {stage: rem[s_i - 1] - rem[s_i]}
            for reason, v in reasons.items():
                if v and n_in:
                    row = out.setdefault(label(stage, reason), {})
                    row[src] = row.get(src, 0.0) + v / n_in
    return out


def collapsed_license_rows(variants: list[tuple[str, str, int]], top: int = LICENSE_ROWS
                           ) -> list[list[str]]:
    """The ``top`` most removed ``(family, license, documents)`` rows, then one
    ``other`` row summing the rest (how many variants, how many documents)."""
    ranked = sorted(variants, key=lambda t: (-t[2], t[0], t[1]))
    rows = [[f, lic, f"{n:,}"] for f, lic, n in ranked[:top]]
    rest = ranked[top:]
    if rest:
        rows.append(["other", f"{len(rest)} more variants", f"{sum(n for *_, n in rest):,}"])
    return rows
