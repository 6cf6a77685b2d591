"""The Hub path for real: huggingface_hub.snapshot_download against an HF cache that this
fixture builds from a shared corpus, with HF_HUB_OFFLINE=1 (the same calls as online)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared import corpora

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path) -> Path:
    """An HF hub cache holding dataset tokenmill-test/c4-sample at COMMIT, refs/main → COMMIT,
    laid out as huggingface_hub writes it (blobs + snapshot symlinks)."""
    cache = tmp_path / "hf-cache"
    repo = cache / "datasets--tokenmill-test--c4-sample"
    src = corpora("c4-en-sample")
    snap = repo / "snapshots" / COMMIT
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / f.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def _run(tmp_path, cache, hub):
    yml = tmp_path / "hub.yaml"
    yml.write_text(
        "name: hubtest\ntokenizer: gpt2\nlicenses: {allow: [odc-by]}\n"
        f"sources:\n  - name: c4hub\n    hub: {hub}\n"
        "    allow_patterns: ['data/*.json.gz']\n    max_documents: 300\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache),
               HF_HOME=str(tmp_path / "hf-home"))
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(yml), "-q",
                           "--num-cpus", "1", "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env)


@pytest.mark.parametrize("revision", ["main", COMMIT])
def test_hub_source_offline(tmp_path, hf_cache, revision):
    r = _run(tmp_path, hf_cache, f"tokenmill-test/c4-sample@{revision}")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    (src,) = m["sources"]
    assert src["origin"] == "hub:tokenmill-test/c4-sample"
    assert src["revision"] == COMMIT  # the pinned commit is recorded, not the branch
    assert src["license"] == "odc-by"  # from the cached dataset card
    assert src["counts"]["read"] == 300 and src["counts"]["kept"] == 300


def test_hub_source_missing_offline_names_source(tmp_path, hf_cache):
    r = _run(tmp_path, hf_cache, "tokenmill-test/not-cached@main")
    assert r.returncode == 2
    assert "source 'c4hub': could not fetch Hub dataset tokenmill-test/not-cached@main" in r.stderr
