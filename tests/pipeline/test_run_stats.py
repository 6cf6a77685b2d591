"""Time per stage through `tokenmill run`: the summary's table, stats.json beside the
manifest (which holds no time), the report's stage_times plot, and a rerun's reuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared import corpora
from tokenmill.pipeline.run.stats import STATS_NAME, RunStats, row_order, stats_table

REPO = Path(__file__).resolve().parents[2]


def _datamix(tmp_path: Path) -> Path:
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"""
name: timed
tokenizer: gpt2
data_root: {corpora()}
licenses: {{allow: [odc-by, psf-2.0]}}
sources:
  - {{name: c4, path: c4-en-sample, max_documents: 300}}
  - {{name: docs, path: python-docs-rst, quality_filters: false}}
quality: {{gopher_quality: {{}}, c4: {{modify_text: false}}}}
language: {{languages: [en], min_score: 0.5}}
fuzzy_dedup: {{}}
shards: {{tokens_per_shard: 200000, val_fraction: 0.0}}
""")
    return mix


def _run(mix: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q",
                           "--num-cpus", "2", "-o", str(out)], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ))


def _ran(mix: Path) -> set[str]:
    """The stage list's stages that run for the datamix (any source)."""
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.run import stage_list

    cfg = load_datamix(mix)
    return {"read"} | {c.name for src in cfg.sources
                       for scope in ("document", "global", "block", "source")
                       for c in stage_list.calls(cfg, src, scope)}


@pytest.mark.slow
def test_run_shows_and_keeps_time_per_stage(tmp_path):
    corpora("c4-en-sample")  # skips without the shared corpora
    mix = _datamix(tmp_path)
    out = tmp_path / "out"
    r = _run(mix, out)
    assert r.returncode == 0, r.stderr
    ran = _ran(mix)
    assert {"gopher_quality", "c4", "language", "fuzzy_dedup", "tokenize", "shards"} <= ran
    lines = r.stdout.splitlines()
    head = lines.index("time per stage (CPU seconds summed over the tasks; rates per core):")
    table = {ln.split()[0]: ln.split() for ln in lines[head + 3:] if ln[:1].isalpha()}
    assert ran <= set(table), f"stages missing from the summary: {ran - set(table)}"
    assert table["tokenize"][-2] != "-" and float(table["tokenize"][-1]) > 0  # MB/s/core
    stats = json.loads((out / STATS_NAME).read_text())
    rows = {row["stage"]: row for row in stats["stages"]}
    assert ran <= set(rows)
    for name in ran:
        assert rows[name]["cpu_seconds"] > 0 and rows[name]["blocks"] > 0, name
        assert rows[name]["documents"] > 0 and rows[name]["mb_per_second"] > 0, name
    assert [row["stage"] for row in stats["stages"]] == \
        [n for n in row_order() if n in rows], "pipeline order"
    assert stats["cpus"] == 2 and stats["wall_seconds"] > 0 and 0 < stats["busy_share"] <= 1
    assert {"ray start", "prepare", "decide", "tokenize", "write"} <= set(stats["phases"])
    # units prepared while Ray started are counted and are some of the run's units
    assert stats["units"] > 1 and 0 <= stats["startup_units"] <= stats["units"]
    manifest = (out / "manifest.json").read_bytes()
    assert b"seconds" not in manifest and STATS_NAME.encode() not in manifest
    html = (out / "report.html").read_text("utf-8")
    assert "<img src='stage_times.png'" in html and (out / "stage_times.png").stat().st_size
    # the rules plot, drawn while the run's last phases went on, is the finished run's
    from tokenmill.pipeline.report.plots import draw
    from tokenmill.pipeline.report.tuning import rules_spec

    spec = rules_spec(out, {})
    assert "<img src='rule_measures.png'" in html
    assert (out / spec.png).read_bytes() == draw(spec.kind, spec.data)
    again = _run(mix, out)  # a rerun: everything reused, nothing timed, same manifest
    assert again.returncode == 0, again.stderr
    assert (out / "manifest.json").read_bytes() == manifest
    redo = {row["stage"]: row for row in json.loads((out / STATS_NAME).read_text())["stages"]}
    assert redo["tokenize"]["blocks"] == 0 and redo["tokenize"]["reused"] > 0
    assert redo["gopher_quality"]["reused"] == rows["gopher_quality"]["blocks"]


def test_stats_table_rates_and_order():
    stats = RunStats.empty()
    stats.merge({"tokenize": [2.0, 100, 4_000_000]})
    stats.merge({"read": [0.5, 100, 4_000_000], "prepare": [0.1, 100, 4_000_000]})
    stats.row("tokenize").reused += 3
    stats.wall_seconds, stats.cpus = 2.6, 1
    assert [n for n, _ in stats.ordered()] == ["read", "prepare", "tokenize"]
    assert stats.row("tokenize").rates() == (50.0, 2.0)
    rows = {r["stage"]: r for r in stats.to_json()["stages"]}
    assert rows["tokenize"]["mb_per_second"] == 2.0 and rows["tokenize"]["reused"] == 3
    assert stats.to_json()["busy_share"] == 1.0
    text = stats_table(stats)
    tok = next(ln for ln in text.splitlines() if ln.startswith("tokenize")).split()
    assert tok == ["tokenize", "1", "3", "100", "4.0", "2.00", "77%", "50", "2.0"]
    assert "wall 2.6 s on 1 CPUs, 100% of them busy" in text
