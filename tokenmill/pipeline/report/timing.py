"""The report's view of where a run's time went: CPU seconds per stage, with documents/s
and MB/s per core, from the run's ``stats.json`` (:mod:`tokenmill.pipeline.run.stats`)."""

from __future__ import annotations

from pathlib import Path

from tokenmill.pipeline.report.plots import PlotSpec
from tokenmill.pipeline.run.stats import OVERHEAD_AFTER, STATS_NAME, load_stats

PNG = "stage_times.png"


def stage_times_spec(out: Path, skipped: dict[str, str]) -> PlotSpec | None:
    """The ``stage_times`` plot of the run in ``out``, or None (and a line in
    ``skipped``) when the folder has no readable ``stats.json`` or it holds no stage."""
    stats = load_stats(out)
    rows = (stats or {}).get("stages") or []
    if not rows:
        skipped[PNG] = f"no {STATS_NAME} with stage times (written by `tokenmill run`)"
        return None
    data = {"stages": [r["stage"] for r in rows],
            "cpu_seconds": [float(r["cpu_seconds"]) for r in rows],
            "mb_per_second": [r.get("mb_per_second") for r in rows],
            "documents_per_second": [r.get("documents_per_second") for r in rows],
            "is_stage": [r["stage"] not in OVERHEAD_AFTER for r in rows],
            "wall_seconds": float(stats.get("wall_seconds", 0.0)),  # type: ignore[union-attr]
            "cpus": int(stats.get("cpus", 1))}  # type: ignore[union-attr]
    busy = float(stats.get("busy_share", 0.0))  # type: ignore[union-attr]
    return PlotSpec(PNG, "Time per stage",
                    "CPU seconds of each stage, summed over the Ray tasks that computed it "
                    "(blocks an earlier run left are not timed), with documents/s and MB/s "
                    "of text per core; grey bars are the executor's own work (storing "
                    "prepared blocks, gathering removals). The CPUs were busy in stages "
                    f"{busy:.0%} of the run's wall time (from {STATS_NAME}).",
                    "stage_times", data)
