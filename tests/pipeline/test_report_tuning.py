"""What the report gives a user to tune filters by: each rule's measure over the documents
that reached it (recorded by the filters in the same pass), with its threshold; removal
rates per source; the mixture's weighted shares; the license table cut to its largest rows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.pipeline.test_report import _build_run, _texts
from tokenmill.cli import main
from tokenmill.pipeline.document.measures import RULES, block_record, merge, read_records
from tokenmill.pipeline.document.quality import GopherQualityFilter
from tokenmill.pipeline.report.tuning import collapsed_license_rows
from tokenmill.pipeline.stage import Document

REPO = Path(__file__).resolve().parents[2]


def test_each_rule_counts_the_documents_that_reach_it():
    docs = [Document(key=f"k{i}", source="s", text=t)
            for i, t in enumerate(_texts("c4-en-sample")[:120])]
    docs += [Document(key="short", source="s", text="Too short to keep.")]
    f = GopherQualityFilter()
    kept = list(f(iter(docs)))
    h = f.measures.histograms()
    order = [r for r in RULES if r.startswith("gopher_quality:")]
    assert list(h) == sorted(order)
    assert sum(h["gopher_quality:word_count"]) == len(docs)  # the first rule: every document
    # a rule is reached by the documents the rules before it kept
    removed_before = 0
    for rule in order:
        assert sum(h[rule]) == len(docs) - removed_before, rule
        removed_before += f.stats.rejected.get(rule, 0)
    assert sum(h["gopher_quality:stop_words"]) - f.stats.rejected.get(
        "gopher_quality:stop_words", 0) == len(kept)
    # fixed bins: blocks add up, and the record carries the thresholds in force
    assert merge([h, h])["gopher_quality:word_count"] == [
        2 * c for c in h["gopher_quality:word_count"]]
    rec = block_record("s", 0, [f])
    assert rec["thresholds"]["gopher_quality:word_count"] == [50.0, 100_000.0]
    assert rec["thresholds"]["gopher_quality:alpha_ratio"] == [0.8]
    edges = RULES["gopher_quality:word_count"].edges()
    assert len(edges) == len(h["gopher_quality:word_count"]) + 1 and np.all(np.diff(edges) > 0)


def test_report_command_draws_each_rule_with_its_threshold(tmp_path):
    out = _build_run(tmp_path / "run")
    per_source = read_records(out / "work" / "measures")
    assert set(per_source) == {"c4", "cc"}
    assert per_source["c4"]["thresholds"]["fineweb:line_punct_ratio"] == [0.12]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "tokenmill.cli", "report", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "wrote" in p.stdout and "rule_measures.png" not in p.stdout  # not skipped
    page = (out / "report.html").read_text("utf-8")
    assert "<img src='rule_measures.png'" in page and "Filter rules" in page
    assert (out / "rule_measures.png").stat().st_size > 10_000
    assert "tokens after curation times its mixture weight" in page


def test_the_report_without_measures_says_why(tmp_path, capsys):
    """The command in this process (its subprocess run: the test above)."""
    out = _build_run(tmp_path / "bare", with_language=False, with_quarantine=False,
                     with_measures=False)
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "rule_measures.png" in capsys.readouterr().out
    assert re.search(r"rule_measures.png: no rule measures recorded",
                     (out / "report.html").read_text("utf-8"))


def test_license_table_keeps_its_largest_rows_and_sums_the_rest():
    variants = [("cc-by-nc", f"cc-by-nc-{i}", n) for i, n in enumerate([5, 1, 9, 3, 3])]
    rows = collapsed_license_rows(variants, top=2)
    assert rows == [["cc-by-nc", "cc-by-nc-2", "9"], ["cc-by-nc", "cc-by-nc-0", "5"],
                    ["other", "3 more variants", "7"]]
    assert collapsed_license_rows(variants[:2], top=2) == [
        ["cc-by-nc", "cc-by-nc-0", "5"], ["cc-by-nc", "cc-by-nc-1", "1"]]
    json.dumps(rows)


class _Stopped(Exception):
    pass


def test_a_run_stopped_after_its_early_plot_leaves_the_last_report_as_it_was(tmp_path):
    """`tokenmill run` draws the rules plot before the run ends, from a copy of the
    measures in the work folder; a rerun with another threshold stopped then leaves the
    finished run's rule_measures.png, work/measures and manifest as they were."""
    from tests.shared import corpora
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.report.plots import render
    from tokenmill.pipeline.report.tuning import rules_spec
    from tokenmill.pipeline.run.executor import run_datamix

    corpora("c4-en-sample")  # skips without the shared corpora
    out = tmp_path / "out"

    def mix(min_words: int) -> Path:
        path = tmp_path / f"mix{min_words}.yaml"
        path.write_text(f"name: ahead\ntokenizer: gpt2\ndata_root: {corpora()}\n"
                        "sources: [{name: c4, path: c4-en-sample, max_documents: 200}]\n"
                        f"quality: {{gopher_quality: {{min_doc_words: {min_words}}}}}\n")
        return path

    assert main(["run", str(mix(50)), "-o", str(out), "-q", "--num-cpus", "1"]) == 0
    before = {p: (out / p).read_bytes() for p in ("rule_measures.png", "manifest.json",
                                                  "work/measures/0000.json")}
    drawn: list[Path] = []

    def stop(ahead: Path) -> None:  # drawn ahead as `tokenmill run` does, then stopped
        spec = rules_spec(ahead, {}, measures=ahead / "measures")
        drawn.append(Path(render(ahead / spec.png, spec.kind, spec.data)))
        raise _Stopped

    cfg = load_datamix(mix(100), output_dir=str(out))
    try:
        run_datamix(cfg, num_cpus=1, progress=False, on_measures=stop)
    except _Stopped:
        pass
    assert drawn and drawn[0].parent == out / "work" / "report-ahead"
    assert json.loads((drawn[0].parent / "measures" / "0000.json").read_text())[
        "thresholds"]["gopher_quality:word_count"][0] == 100
    assert {p: (out / p).read_bytes() for p in before} == before
