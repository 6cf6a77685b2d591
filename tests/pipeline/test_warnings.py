"""No silent outcomes: a file that yields no document, a source that keeps none, and a
source with a high quarantined share are warnings in the summary and the manifest, and
errors with ``tokenmill run --strict``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenmill import cli
from tokenmill.manifests.summary import summary_table
from tokenmill.pipeline.config import load_datamix
from tokenmill.pipeline.run.executor import run_datamix
from tokenmill.raysession import ray_session


@pytest.fixture(autouse=True)
def _datamix_root_from_the_file(monkeypatch):
    """These datamixes name their own data_root; `make` exports TOKENMILL_DATA_ROOT, which
    would take precedence over it."""
    monkeypatch.delenv("TOKENMILL_DATA_ROOT", raising=False)


_DOCS = [f"Document number {i} says something different about topic {i * 7}." for i in range(12)]


def _source(root: Path, name: str, files: dict[str, str]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "README.md").write_text("---\nlicense: mit\n---\n")
    for rel, text in files.items():
        (root / name / rel).write_text(text)


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("warnings")
    _source(root, "mixed", {
        "good.jsonl": "".join(json.dumps({"text": t}) + "\n" for t in _DOCS),
        "empty.jsonl": "",
        "bad.jsonl": "{not json\n[1, 2\n{\"txt\": 1}\n",
        "blank.txt": " \n\t\n",  # one document, empty after normalization
    })
    # every row quarantined: two unreadable rows, one that normalizes to nothing
    _source(root, "broken", {"rows.jsonl": '{oops\n{"text": "\\u0000"}\n{"a": \n'})
    (root / "mix.yaml").write_text(
        "name: warn\ndata_root: .\nlicenses: {allow: [mit]}\n"
        "sources: [{name: mixed, path: mixed, quality_filters: false},"
        " {name: broken, path: broken, quality_filters: false}]\n"
        "shards: {tokens_per_shard: 100000, val_fraction: 0.0}\n")
    return root / "mix.yaml"


def test_empty_files_empty_sources_and_quarantine_share_are_warnings(mix, tmp_path):
    cfg = load_datamix(mix, output_dir=str(tmp_path / "out"))
    with ray_session(num_cpus=1):
        res = run_datamix(cfg, progress=False)
        on_disk = json.loads(res.manifest_path.read_text())["warnings"]
        cfg.checks.max_quarantine_share = 0.1  # 4 of 16 rows of `mixed` now count too
        strict = run_datamix(cfg, progress=False)
    got = [(w.kind, w.source, w.file) for w in res.warnings]
    assert got == [("empty_file", "mixed", "bad.jsonl"), ("empty_file", "mixed", "blank.txt"),
                   ("empty_file", "mixed", "empty.jsonl"), ("empty_file", "broken", "rows.jsonl"),
                   ("empty_source", "broken", None), ("quarantine_share", "broken", None)]
    msgs = [w.message for w in res.warnings]
    assert msgs[0] == ("source 'mixed': file bad.jsonl yields no document (every row "
                       "quarantined: invalid_json 2, missing_text 1)")
    assert msgs[1].endswith("file blank.txt yields no document (every row quarantined: "
                            "empty 1)")
    assert msgs[2].endswith("file empty.jsonl yields no document (no rows)")
    assert msgs[4].startswith("source 'broken' keeps 0 of 3 documents")
    assert "3 of 3 rows quarantined (100%, over checks.max_quarantine_share 50%)" in msgs[5]
    # in the manifest on disk, and in the summary table (a column and one line each)
    assert [w["message"] for w in on_disk] == msgs
    table = summary_table(res.manifest)
    assert table.splitlines()[0].split()[-1] == "warnings"
    assert all(f"WARNING {m}" in table for m in msgs)
    # the threshold is the datamix's
    assert ("quarantine_share", "mixed", None) in [(w.kind, w.source, w.file)
                                                   for w in strict.warnings]
    assert strict.reused_units == strict.total_units  # only the manifest changed


def test_strict_makes_each_warning_an_error(mix, tmp_path, capsys):
    out = str(tmp_path / "out")
    with ray_session(num_cpus=1):
        assert cli.main(["run", str(mix), "-q", "--no-report", "-o", out]) == 0
        captured = capsys.readouterr()
        assert captured.out.count("WARNING ") == 6
        assert cli.main(["run", str(mix), "-q", "--no-report", "-o", out, "--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("tokenmill: error: source '") for line in err)
    assert "file empty.jsonl yields no document" in err[2]

