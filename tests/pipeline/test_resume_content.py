"""The resume cache is keyed by content: new bytes in a file are curated again even when
its size and mtime are unchanged (case ``stale-mtime`` of ../shared/cases, copied under
``tests/pipeline/cases/stale-mtime``), and only that file's blocks are redone."""

from __future__ import annotations

import hashlib
import os
import runpy
import shutil
from pathlib import Path

import pytest

from tokenmill.manifests.shards import iter_documents
from tokenmill.pipeline.config import load_datamix
from tokenmill.pipeline.run.executor import run_datamix
from tokenmill.raysession import ray_session
from tokenmill.tokenizers import get_encoding


@pytest.fixture(autouse=True)
def _datamix_root_from_the_file(monkeypatch):
    """These datamixes name their own data_root; `make` exports TOKENMILL_DATA_ROOT, which
    would take precedence over it."""
    monkeypatch.delenv("TOKENMILL_DATA_ROOT", raising=False)


CASE = Path(__file__).parent / "cases" / "stale-mtime"


def _make(case: Path, script: str) -> None:
    cwd = os.getcwd()
    os.chdir(case)
    try:
        runpy.run_path(str(case / script))
    finally:
        os.chdir(cwd)


def _texts(res) -> list[str]:
    enc = get_encoding("gpt2")
    out = res.manifest_path.parent
    return sorted(enc.decode(t[1:].tolist()) for sh in res.manifest.shards()
                  for _, t in iter_documents(out / sh.path))


def test_new_bytes_with_same_size_and_mtime_redo_exactly_that_file(tmp_path):
    case = tmp_path / "case"
    shutil.copytree(CASE, case)
    # a second file that does not change: its blocks must be reused
    (case / "src" / "other.jsonl").write_text('{"text": "Gift cards never expire."}\n')
    _make(case, "make_v1.py")
    faq = case / "src" / "faq.jsonl"
    st1 = faq.stat()
    cfg = load_datamix(case / "mix.yaml", output_dir=str(tmp_path / "out"))
    with ray_session(num_cpus=1):
        first = run_datamix(cfg, progress=False)
        assert "Returns are accepted for 30 days." in _texts(first)
        _make(case, "make_v2.py")
        st2 = faq.stat()
        assert (st2.st_size, st2.st_mtime_ns) == (st1.st_size, st1.st_mtime_ns)
        second = run_datamix(cfg, progress=False)
    assert _texts(second) == ["Gift cards never expire.", "Returns are accepted for 60 days.",
                              "The store opens at nine."]
    # exactly the changed file's block is redone, the other file's is reused
    assert first.stage_blocks["read"] == [0, 2]
    assert second.stage_blocks["read"] == [1, 1]
    assert second.stage_blocks["tokenize"] == [1, 1]
    # the manifest records each input file's path, size and sha256 (of the bytes read)
    files = {f.path: f for f in second.manifest.sources[0].files}
    assert set(files) == {"faq.jsonl", "other.jsonl"}
    assert files["faq.jsonl"].size == st2.st_size
    assert files["faq.jsonl"].sha256 == hashlib.sha256(faq.read_bytes()).hexdigest()
    before = {f.path: f for f in first.manifest.sources[0].files}
    assert before["faq.jsonl"].sha256 != files["faq.jsonl"].sha256
    assert before["other.jsonl"] == files["other.jsonl"]
    assert second.input_bytes == sum(f.size for f in files.values())
