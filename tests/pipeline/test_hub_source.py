"""The Hub path for real: huggingface_hub.snapshot_download against an HF cache that this
fixture builds from a shared corpus, with HF_HUB_OFFLINE=1 (the same calls as online)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared import corpora

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fill_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """Put dataset ``repo_id`` at COMMIT (refs/main → COMMIT) into HF hub cache ``cache``,
    laid out as huggingface_hub writes it (blobs + snapshot symlinks); returns the
    snapshot folder."""
    repo = cache / f"datasets--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / COMMIT
    for rel, data in sorted(files.items()):
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory) -> Path:
    """An HF hub cache holding dataset tokenmill-test/c4-sample (the shared c4 sample's
    files) at COMMIT, and tokenmill-test/multi (:func:`_multi_files`)."""
    cache = tmp_path_factory.mktemp("hub") / "hf-cache"
    src = corpora("c4-en-sample")
    _fill_cache(cache, "tokenmill-test/c4-sample",
                {f.relative_to(src).as_posix(): f.read_bytes()
                 for f in sorted(p for p in src.rglob("*") if p.is_file())})
    _fill_cache(cache, "tokenmill-test/multi", _multi_files()[0])
    return cache


def _env(tmp_path, cache) -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache),
                HF_HOME=str(tmp_path / "hf-home"))


C4_LINES = ("allow_patterns: ['data/*.json.gz']", "max_documents: 300")
MULTI_LINES = ("config: en", "split: validation")


def _start(tmp_path, cache, sources: dict[str, tuple[str, tuple[str, ...]]],
           *extra) -> subprocess.Popen:
    """``tokenmill run`` of a datamix of Hub sources (name -> (hub id, lines)) into
    ``tmp_path/out``, started (the module's runs go side by side: each is mostly its own
    Ray's start-up)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    yml = tmp_path / "hub.yaml"
    yml.write_text(
        "name: hubtest\ntokenizer: gpt2\nlicenses: {allow: [odc-by]}\nsources:\n"
        + "".join(f"  - name: {name}\n    hub: {hub}\n"
                  + "".join(f"    {line}\n" for line in lines)
                  for name, (hub, lines) in sources.items()))
    return subprocess.Popen([sys.executable, "-m", "tokenmill.cli", "run", str(yml), "-q",
                             "--num-cpus", "1", "-o", str(tmp_path / "out"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path, cache))


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def hub_runs(tmp_path_factory, hf_cache) -> dict:
    """Every ``tokenmill run`` of this module, started together: name -> (folder, result).
    "main" reads both cached datasets as two sources (a Ray start is most of a run). They
    join the test worker's Ray (the address is in the environment they inherit)."""
    from tokenmill.raysession import init_ray

    init_ray(num_cpus=2)  # the folder's shared Ray, which the tests would start next
    root = tmp_path_factory.mktemp("hub-runs")
    started = {
        "main": _start(root / "main", hf_cache, {
            "c4hub": ("tokenmill-test/c4-sample@main", C4_LINES),
            "multi": (f"tokenmill-test/multi@{COMMIT}", MULTI_LINES)},
            "--no-report", "--write-text"),
        "missing": _start(root / "missing", hf_cache,
                          {"c4hub": ("tokenmill-test/not-cached@main", C4_LINES)}),
    }
    return {name: (root / name, _finish(p)) for name, p in started.items()}


def _source(manifest: dict, key: str, name: str) -> dict:
    (src,) = [s for s in manifest[key] if s["name"] == name]
    return src


def test_hub_source_offline(hub_runs):
    """`tokenmill run` of a Hub source named by its branch, from the HF cache alone: the
    manifest records the commit the branch points to and the card's license."""
    folder, r = hub_runs["main"]
    assert r.returncode == 0, r.stderr
    m = json.loads((folder / "out" / "manifest.json").read_text())
    src = _source(m, "sources", "c4hub")
    assert src["origin"] == "hub:tokenmill-test/c4-sample"
    assert src["revision"] == COMMIT  # the pinned commit is recorded, not the branch
    assert src["license"] == "odc-by"  # from the cached dataset card
    assert src["counts"]["read"] == 300 and src["counts"]["kept"] == 300


def test_hub_source_pinned_to_its_commit_offline(resolved):
    """A Hub source pinned to a commit resolves from the HF cache alone to that commit and
    the snapshot's files (what the run above reads, the branch resolved first)."""
    said = resolved[PINNED]
    assert said.startswith(f"OK hub:tokenmill-test/c4-sample {COMMIT} ["), said
    assert "'data/" in said, said


def test_hub_source_missing_offline_names_source(hub_runs):
    _, r = hub_runs["missing"]
    assert r.returncode == 2
    assert "source 'c4hub': could not fetch Hub dataset tokenmill-test/not-cached@main" in r.stderr


# A dataset repository that is not plain files: configs declared in the card's YAML,
# parquet files per config and split, as `datasets` (and the Hub's parquet layout) use.
_CARD = """---
license: odc-by
configs:
- config_name: en
  data_files:
  - split: train
    path: en/train-*.parquet
  - split: validation
    path: en/validation-*.parquet
- config_name: de
  data_files:
  - split: train
    path: de/train-*.parquet
---
# tokenmill test dataset
"""
_ROWS = {("en", "train"): (0, 40), ("en", "validation"): (40, 60), ("de", "train"): (60, 90)}


@functools.cache  # the cache fixture writes the files, the tests read the texts
def _multi_files() -> tuple[dict[str, bytes], list[str]]:
    """tokenmill-test/multi: the c4 sample's last 90 documents cut into configs en
    (train 40, validation 20) and de (train 30). Returns (files, texts)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    (data,) = sorted((corpora("c4-en-sample") / "data").glob("*.json.gz"))
    with gzip.open(data, "rt", encoding="utf-8") as f:  # the last 90: no exact duplicates
        texts = [json.loads(line)["text"] for line in f][-90:]  # of c4hub's first 300
    files = {"README.md": _CARD.encode()}
    for (config, split), (a, b) in _ROWS.items():
        buf = pa.BufferOutputStream()
        pq.write_table(pa.table({"text": texts[a:b], "id": list(range(a, b))}), buf)
        files[f"{config}/{split}-00000-of-00001.parquet"] = buf.getvalue().to_pybytes()
    return files, texts


@pytest.fixture(scope="module")
def hf_config_cache(hf_cache) -> tuple[Path, Path, list[str]]:
    """(cache, snapshot of tokenmill-test/multi, its texts) of :func:`hf_cache`."""
    snap = hf_cache / "datasets--tokenmill-test--multi" / "snapshots" / COMMIT
    return hf_cache, snap, _multi_files()[1]


def test_hub_config_split_reads_exactly_those_rows(tmp_path, hf_config_cache, hub_runs):
    """config en + split validation: the 20 rows `datasets` gives for them, nothing of the
    other config or split; the manifest records repo, config, split and commit."""
    import datasets
    import pyarrow.parquet as pq

    cache, snap, texts = hf_config_cache
    folder, r = hub_runs["main"]
    assert r.returncode == 0, r.stderr
    out = folder / "out"
    m = json.loads((out / "manifest.json").read_text())
    src = _source(m, "sources", "multi")
    assert src["origin"] == "hub:tokenmill-test/multi?config=en&split=validation"
    assert src["revision"] == COMMIT
    assert [f["path"] for f in src["files"]] == ["en/validation-00000-of-00001.parquet"]
    assert src["counts"]["read"] == 20
    cfg_src = _source(m["config"], "sources", "multi")
    assert (cfg_src["config"], cfg_src["split"]) == ("en", "validation")
    # the kept documents are exactly (a subset, after filters, of) datasets' rows
    ref = datasets.load_dataset(str(snap), "en", split="validation",
                                cache_dir=str(tmp_path / "ds-cache"))["text"]
    assert list(ref) == texts[40:60]
    kept = [t for p in sorted((out / "text" / "multi").rglob("*.parquet"))
            for t in pq.read_table(p).column("text").to_pylist()]
    assert kept and set(kept) <= set(ref)


# Resolves each source given as a JSON list of [hub, {field: value}] and prints one line per
# source: "<index> <message as JSON>" (one interpreter for all: importing datasets costs
# seconds), the message being what a user sees ("OK origin revision files" or "ERR error").
_RESOLVE = """
import json, sys
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.read.sources import SourceError, resolve_source
for i, (hub, fields) in enumerate(json.loads(sys.argv[1])):
    cfg = DatamixConfig.model_validate({"name": "x", "sources": [dict(name="s", hub=hub,
                                                                      **fields)]})
    try:
        r = resolve_source(cfg, cfg.sources[0])
        msg = f"OK {r.origin} {r.revision} {r.files}"
    except SourceError as e:
        msg = f"ERR {e}"
    print(i, json.dumps(msg), flush=True)
"""


def _resolve(tmp_path, cache, sources: list[tuple[str, list[str]]]) -> list[str]:
    """What resolving each (hub, ["field=value", ...]) says, from the HF cache alone."""
    arg = json.dumps([[hub, dict(f.split("=", 1) for f in fields)] for hub, fields in sources])
    r = subprocess.run([sys.executable, "-c", _RESOLVE, arg], capture_output=True,
                       text=True, env=_env(tmp_path, cache))
    lines = r.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == [str(i) for i in range(len(sources))], (
        r.stdout + r.stderr)
    return [json.loads(line.split(" ", 1)[1]) for line in lines]


#: (hub, fields, what resolving says)
CONFIG_CASES = [
    ("tokenmill-test/multi@main", ["config=de"],
     f"OK hub:tokenmill-test/multi?config=de&split=train {COMMIT} "
     "['de/train-00000-of-00001.parquet']"),
    ("tokenmill-test/multi@main", ["config=de", "split=validation"],
     "ERR source 's': no split 'validation' in config 'de' of tokenmill-test/multi@main "
     "(splits: train)"),
    ("tokenmill-test/multi@main", ["config=fr", "split=train"], "'fr' not found"),
    (f"tokenmill-test/multi@{'f' * 40}", ["config=en"], "could not fetch"),
    ("tokenmill-test/multi@main", ["split=validation"],
     "ERR source 's': dataset tokenmill-test/multi@main config 'default': Config name is "
     "missing. Please pick one among the available configs: ['en', 'de']"),
    ("tokenmill-test/c4-sample@main", ["config=en"], "ERR source 's': dataset "
     "tokenmill-test/c4-sample@main config 'en':"),
]
PINNED = (f"tokenmill-test/c4-sample@{COMMIT}", ())


@pytest.fixture(scope="module")
def resolved(tmp_path_factory, hf_cache) -> dict[tuple[str, tuple[str, ...]], str]:
    """What resolving each source of CONFIG_CASES and PINNED says: (hub, fields) -> line."""
    sources = [PINNED, *((hub, tuple(fields)) for hub, fields, _ in CONFIG_CASES)]
    said = _resolve(tmp_path_factory.mktemp("resolve"), hf_cache,
                    [(hub, list(fields)) for hub, fields in sources])
    return dict(zip(sources, said, strict=True))


def test_hub_config_split_errors(resolved):
    """Unknown splits and configs are named with the ones there are; a pinned sha that is
    not the snapshot's commit is refused; each message is one line, whatever datasets
    raised."""
    for hub, fields, expect in CONFIG_CASES:
        msg = resolved[hub, tuple(fields)]
        assert expect in msg, (hub, fields, msg)
        assert "\n" not in msg, msg
