"""PII and the URL filter through `tokenmill run`: manifest counts, quarantine records."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.shared import corpora

REPO = Path(__file__).resolve().parents[2]


def _archive(path: Path, domains: list[str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        data = ("\n".join(domains) + "\n").encode()
        info = tarfile.TarInfo("blacklists/adult/domains")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _datamix(tmp_path: Path) -> Path:
    (tmp_path / "words.txt").write_text("blog\n")
    _archive(tmp_path / "ut1.tar.gz", ["wikidot.com"])
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"""
name: curate
tokenizer: gpt2
data_root: {corpora()}
licenses: {{allow: [odc-by]}}
sources:
  - {{name: c4, path: c4-en-sample, url_field: url, max_documents: 400}}
  - {{name: cc, path: cc-main-2019-sample, url_field: metadata.url, license: odc-by}}
url_filter:
  archive: ut1.tar.gz
  banned_words: [words.txt]
pii: {{}}
shards: {{tokens_per_shard: 100000, val_fraction: 0.0}}
""")
    return mix


def _run(mix: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q",
                           "-o", str(out)], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ))


@pytest.mark.slow
def test_pii_and_url_filter_through_run(tmp_path):
    pytest.importorskip("tldextract")
    mix = _datamix(tmp_path)
    r = _run(mix, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    by_name = {s["name"]: s for s in manifest["sources"]}
    c4, cc = by_name["c4"], by_name["cc"]
    assert c4["counts"]["filtered"].get("url_filter:hard_blacklisted", 0) > 0
    assert cc["counts"]["filtered"].get("url_filter:domain", 0) > 0
    assert sum(cc["pii_replacements"].values()) > 0
    rows = [r for q in manifest["quarantine"]
            for r in pq.read_table(tmp_path / "out" / q["path"]).to_pylist()]
    assert {r["reason"] for r in rows if r["stage"] == "url_filter"} >= {"url_filter:domain"}
    edits = [r for r in rows if r["reason"].startswith("pii:edit:")]
    assert edits and all(json.loads(e["detail"])["start"] >= 0 for e in edits)
    shards = sorted(p.name for p in (tmp_path / "out").rglob("*.bin"))
    again = _run(mix, tmp_path / "out2")
    assert again.returncode == 0
    m2 = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert [s["shards"] for s in m2["sources"]] == [s["shards"] for s in manifest["sources"]]
    assert shards


def test_missing_block_list_is_a_one_line_error(tmp_path):
    mix = _datamix(tmp_path)
    (tmp_path / "words.txt").unlink()
    r = _run(mix, tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.startswith("tokenmill: ") and "words.txt" in r.stderr
    assert "Traceback" not in r.stderr
