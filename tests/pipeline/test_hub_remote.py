"""A Hub source's config and split, read from a Hub on 127.0.0.1 (``HF_ENDPOINT``) that
logs every request: only the dataset card and that config's and split's files are fetched
(besides the API's repo info and tree listings), never the other configs' files, and the
manifest lists the files read with their sizes."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys

import pytest

from tests.pipeline.fake_hub import FakeRepo, fake_hub, hub_env
from tests.shared import corpora

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
REPO_ID = "tokenmill-test/remote-multi"
CARD = """---
license: odc-by
configs:
- config_name: en
  data_files:
  - split: train
    path: en/train-*.parquet
  - split: validation
    path: en/validation-*.parquet
- config_name: de
  default: true
  data_files:
  - split: train
    path: de/train-*.jsonl
---
# tokenmill test dataset
"""


def _texts(n: int) -> list[str]:
    (data,) = sorted((corpora("c4-en-sample") / "data").glob("*.json.gz"))
    with gzip.open(data, "rt", encoding="utf-8") as f:
        return [json.loads(next(f))["text"] for _ in range(n)]


def _parquet(texts: list[str]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def repo_files() -> dict[str, bytes]:
    """Configs en (train: 2 parquet files, validation: 1) and de (train: jsonl), plus a
    file no config names."""
    t = _texts(100)
    jsonl = "".join(json.dumps({"text": x}) + "\n" for x in t[70:100]).encode()
    return {"README.md": CARD.encode(),
            "en/train-00000-of-00002.parquet": _parquet(t[0:25]),
            "en/train-00001-of-00002.parquet": _parquet(t[25:50]),
            "en/validation-00000-of-00001.parquet": _parquet(t[50:70]),
            "de/train-00000-of-00001.jsonl": jsonl,
            "extra/notes.jsonl": b'{"text": "not part of any config"}\n'}




def _fetched(repo: FakeRepo) -> set[str]:
    """The repository files whose contents (or metadata, HEAD) were asked for."""
    prefix = f"/datasets/{REPO_ID}/resolve/"
    return {p[len(prefix):].partition("/")[2] for _, p in repo.requests if p.startswith(prefix)}


_RESOLVE = """
import json, sys
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.read.sources import SourceError, resolve_source
cfg = DatamixConfig.model_validate({"name": "x", "sources": [dict(
    name="s", hub=sys.argv[1], **{k: json.loads(v) if v[:1] == "[" else v
                                  for k, v in (a.split("=", 1) for a in sys.argv[2:])})]})
try:
    r = resolve_source(cfg, cfg.sources[0])
    print("OK", r.revision, r.files, r.license)
except SourceError as e:
    print("ERR", e)
"""


@pytest.mark.parametrize(("fields", "expect", "fetched"), [
    (["config=en", "split=validation"],
     f"OK {COMMIT} ['en/validation-00000-of-00001.parquet'] odc-by",
     {"README.md", "en/validation-00000-of-00001.parquet"}),
    (["config=en"], f"OK {COMMIT} ['en/train-00000-of-00002.parquet', "
     "'en/train-00001-of-00002.parquet'] odc-by",
     {"README.md", "en/train-00000-of-00002.parquet", "en/train-00001-of-00002.parquet"}),
    (["config=en", 'allow_patterns=["*00001-of-*"]'],
     f"OK {COMMIT} ['en/train-00001-of-00002.parquet'] odc-by",
     {"README.md", "en/train-00001-of-00002.parquet"}),  # narrowed by allow_patterns
    (["split=train"], f"OK {COMMIT} ['de/train-00000-of-00001.jsonl'] odc-by",
     {"README.md", "de/train-00000-of-00001.jsonl"}),  # the card's default config
    (["config=de", "split=test"], "ERR source 's': no split 'test' in config 'de' of "
     f"{REPO_ID}@main (splits: train)", {"README.md"}),
    (["config=fr"], f"ERR source 's': dataset {REPO_ID}@main config 'fr': BuilderConfig "
     "'fr' not found. Available: ['en', 'de']", {"README.md"}),
])
def test_only_the_card_and_the_split_files_are_fetched(tmp_path, repo_files, fields, expect,
                                                       fetched):
    repo = FakeRepo(REPO_ID, COMMIT, repo_files)
    with fake_hub(repo) as endpoint:
        r = subprocess.run([sys.executable, "-c", _RESOLVE, f"{REPO_ID}@main", *fields],
                           capture_output=True, text=True, env=hub_env(tmp_path, endpoint),
                           timeout=120)
    assert r.stdout.strip() == expect, r.stdout + r.stderr[-3000:]
    assert _fetched(repo) == fetched, repo.requests
    methods = {m for m, _ in repo.requests}
    assert methods <= {"GET", "HEAD", "POST"}
    # the files of the other configs are never asked for, not even listed one by one
    assert not any("extra/" in p for _, p in repo.requests if "/resolve/" in p)


@pytest.mark.slow
def test_tokenmill_run_reads_one_config_from_the_hub(tmp_path, repo_files):
    """``tokenmill run`` on a pinned commit, config en, split train: 50 documents from its
    two files, each listed in the manifest with its size; a second run reads them from the
    cache (no file fetched again) and gives the same bytes."""
    from tests.conftest import final_files

    mix = tmp_path / "hub.yaml"
    mix.write_text("name: hubremote\ntokenizer: gpt2\nlicenses: {allow: [odc-by]}\n"
                   f"sources:\n  - name: remote\n    hub: {REPO_ID}@{COMMIT}\n"
                   "    config: en\n    split: train\n")
    repo = FakeRepo(REPO_ID, COMMIT, repo_files)
    outs = []
    with fake_hub(repo) as endpoint:
        for run in ("first", "again"):
            out = tmp_path / run
            r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q",
                                "--num-cpus", "1", "--no-report", "-o", str(out)],
                               capture_output=True, text=True, env=hub_env(tmp_path, endpoint),
                               timeout=600)
            assert r.returncode == 0, r.stderr
            outs.append(out)
            if run == "first":
                assert _fetched(repo) == {"README.md", "en/train-00000-of-00002.parquet",
                                          "en/train-00001-of-00002.parquet"}
                repo.requests.clear()
        assert not any(m == "GET" and "/resolve/" in p for m, p in repo.requests)
    (src,) = json.loads((outs[0] / "manifest.json").read_text())["sources"]
    assert src["origin"] == f"hub:{REPO_ID}?config=en&split=train"
    assert src["revision"] == COMMIT and src["license"] == "odc-by"
    assert [(f["path"], f["size"]) for f in src["files"]] == [
        (p, len(repo_files[p])) for p in ("en/train-00000-of-00002.parquet",
                                          "en/train-00001-of-00002.parquet")]
    assert src["counts"]["read"] == 50
    assert final_files(outs[0]) == final_files(outs[1])


@pytest.mark.parametrize(("files", "split", "expect"), [
    (["data/train-00000-of-00001.jsonl", "data/test-00000-of-00001.jsonl"], "test",
     "data/test-00000-of-00001.jsonl"),  # datasets' data/{split}-* layout
    (["data/train-0.jsonl", "data/test-0.jsonl", "NOCARD"], "train",
     "data/train-0.jsonl"),  # no card at all: the license comes from the datamix
    (["train/a.jsonl", "validation/a.jsonl"], "validation", "validation/a.jsonl"),  # {split}/
    (["corpus-train-0.jsonl", "corpus-validation-0.jsonl"], "validation",
     "corpus-validation-0.jsonl"),  # *-{split}-*
])
def test_without_configs_the_default_layout_decides(tmp_path, files, split, expect):
    """A card without ``configs:``: ``datasets``' default file layout names the splits of
    config ``default``; only the chosen split's file is fetched."""
    card = "NOCARD" not in files
    repo = FakeRepo(REPO_ID, COMMIT, {f: b'{"text": "hello"}\n' for f in files
                                      if f != "NOCARD"})
    if card:
        repo.files["README.md"] = b"---\nlicense: mit\n---\n"
    with fake_hub(repo) as endpoint:
        r = subprocess.run([sys.executable, "-c", _RESOLVE, f"{REPO_ID}@{COMMIT}",
                            f"split={split}", *([] if card else ["license=mit"])],
                           capture_output=True, text=True, env=hub_env(tmp_path, endpoint),
                           timeout=120)
    assert r.stdout.strip() == f"OK {COMMIT} [{expect!r}] mit", r.stdout + r.stderr[-3000:]
    assert _fetched(repo) == {"README.md", expect}  # README.md: asked for, or found missing
