"""The commands after curation with their inputs and outputs in an S3 bucket: ``mix build``,
``shards export``, ``ngram build``, ``legality build`` and ``train``, each run through the
command a user types against a real S3-compatible server on 127.0.0.1 (moto's server mode,
:mod:`tests.s3server`), and compared with the same command on local folders laid out as
the bucket is (so relative paths agree): the bucket's objects are the local run's bytes.

A curation output and a mix spec are uploaded to ``s3://runs`` (a small curation written
by :func:`tests.manifests.mixdata.write_curation`); outputs go to ``s3://out``. A bucket
that does not exist, on the input or the output side, is one line naming the URL, exit 2.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.manifests.mixdata import write_curation
from tests.s3server import S3Server
from tests.shared import corpora

REPO = Path(__file__).resolve().parents[1]
SPEC = {"name": "web-mix", "manifests": ["../web"], "target_tokens": 60_000, "seed": 3,
        "sources": {"c4": {"source": "c4-en-sample", "weight": 1.0, "max_epochs": 2}}}


def _write_tiny_tokenizer(folder: Path) -> Path:
    """A ``tokenizer:`` table of GPT-2's first 320 ranks (a BPE of its own: every merge's
    parts rank lower) and an end-of-text token: its legality table builds in a second."""
    from tokenmill.tokenizers.legality_regex import R50K_PAT
    from tokenmill.tokenizers.tiktoken_parts import encoding_parts

    folder.mkdir(parents=True, exist_ok=True)
    ranks = sorted(((t, r) for t, r in encoding_parts("gpt2").mergeable_ranks.items()
                    if r < 320), key=lambda kv: kv[1])
    (folder / "tiny.tiktoken").write_bytes(
        b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))
    (folder / "tokenizer.yaml").write_text(yaml.safe_dump({
        "name": "gpt2-tiny", "ranks": "tiny.tiktoken", "pattern": R50K_PAT,
        "special_tokens": {"<|endoftext|>": 320}, "eot": "<|endoftext|>"}))
    return folder / "tokenizer.yaml"


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory) -> Path:
    """``runs/``: ``web/`` (a curation output of 300 c4 documents in several shards),
    ``specs/spec.yaml`` (a mix of it, naming it ``../web``) and ``mixes/mix.json`` (that
    mix, built locally)."""
    root = tmp_path_factory.mktemp("local") / "runs"
    write_curation(corpora(), root / "web", "web", {"c4-en-sample": 300},
                   max_shard_tokens=40_000)
    (root / "specs").mkdir()
    (root / "specs" / "spec.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    r = _tm(root, "mix", "build", "specs/spec.yaml", "-o", "mixes/mix.json")
    assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def s3(local_runs):
    srv = S3Server().start()
    try:
        s3c = srv.client()
        for bucket in ("runs", "out"):
            s3c.create_bucket(Bucket=bucket)
        for folder in ("web", "specs", "mixes"):
            srv.put_folder(local_runs / folder, "runs", folder)
        yield srv
    finally:
        srv.stop()


def _tm(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m tokenmill.cli ARGS`` in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], cwd=cwd,
                          env=env or dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=600)


def _env(srv: S3Server, tmp: Path) -> dict:
    """The server's endpoint and credentials, and a staging folder (and cache) of the
    test's own: nothing is read from an earlier test's copies."""
    return srv.env("admin", base=dict(os.environ, PYTHONPATH=str(REPO),
                                      TOKENMILL_STAGING_DIR=str(tmp / "staging")))


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def _local_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_mix_build_from_a_bucket_to_a_bucket(s3, local_runs, tmp_path):
    """The spec and the curation output it names in the bucket, the mix manifest written
    to another: the bytes of the local build (paths relative to the mix's folder)."""
    out = _ok(_tm(tmp_path, "mix", "build", "s3://runs/specs/spec.yaml", "-o",
                  "s3://runs/mixes/again.json", env=_env(s3, tmp_path)))
    assert "wrote s3://runs/mixes/again.json" in out
    built = s3.objects("runs", "mixes")["again.json"]
    assert built == (local_runs / "mixes" / "mix.json").read_bytes()
    assert json.loads(built)["sources"][0]["shards"][0]["path"].startswith("../web/shards/")


def test_mix_build_names_a_bucket_folder_by_its_url(s3, local_runs, tmp_path):
    """A local spec naming the curation output by its URL, the mix written to another
    bucket: its shards are listed by their URLs, with the sha256 of the local build's."""
    spec = dict(SPEC, manifests=["s3://runs/web"])
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = _env(s3, tmp_path)
    _ok(_tm(tmp_path, "mix", "build", "spec.yaml", "-o", "s3://out/url/mix.json", env=env))
    m = json.loads(s3.objects("out", "url")["mix.json"])
    assert m["sources"][0]["shards"][0]["path"].startswith("s3://runs/web/shards/")
    local = json.loads((local_runs / "mixes" / "mix.json").read_bytes())
    assert [s["sha256"] for s in m["sources"][0]["shards"]] == \
        [s["sha256"] for s in local["sources"][0]["shards"]]


def test_shards_export_from_a_bucket_to_a_bucket(s3, local_runs, tmp_path):
    """``shards export`` of the mix manifest in the bucket into a bucket folder: every
    object is the local export's bytes, export.json included."""
    from tokenmill.manifests.export import export_mix
    from tokenmill.manifests.export_plan import LoaderSettings

    export_mix(local_runs / "mixes" / "mix.json", tmp_path / "local", "modded-nanogpt",
               shard_tokens=20_000, settings=LoaderSettings(seq_len=64), log=lambda _: None)
    out = _ok(_tm(tmp_path, "shards", "export", "s3://runs/mixes/mix.json", "-o",
                  "s3://out/export", "--format", "modded-nanogpt", "--seq-len", "64",
                  "--shard-tokens", "20000", env=_env(s3, tmp_path)))
    assert "s3://out/export/" in out and "staging" not in out, out  # where the user asked
    local = _local_files(tmp_path / "local")
    assert len(local) > 4
    assert s3.objects("out", "export") == local


def test_ngram_build_from_a_bucket_to_a_bucket(s3, local_runs, tmp_path):
    """``ngram build --counts`` of the curation output in the bucket into a bucket folder:
    the index's and the counts' files are the local build's bytes."""
    from tokenmill.ngram.counts import build_counts
    from tokenmill.ngram.index import build_index

    build_index(local_runs / "web", tmp_path / "local", progress=False)
    build_counts(tmp_path / "local", tmp_path / "local" / "counts", orders=[2, 3])
    out = _ok(_tm(tmp_path, "ngram", "build", "s3://runs/web", "-o", "s3://out/index",
                  "--counts", "--orders", "2-3", "-q", env=_env(s3, tmp_path)))
    assert "suffix-array index -> s3://out/index" in out
    local = _local_files(tmp_path / "local")
    assert {"meta.json", "sa.bin", "tokens.bin", "counts/counts.json"} <= set(local)
    assert s3.objects("out", "index") == local


def test_legality_build_to_a_bucket(s3, tmp_path):
    """``legality build -o s3://...``: the table and the prefix map beside it hold the
    local build's rows and identity (a header also records the build time)."""
    from tokenmill.tokenizers.legality import LegalityTable

    tok = _write_tiny_tokenizer(tmp_path / "tok")
    _ok(_tm(tok.parent, "legality", "build", "tokenizer.yaml", "-o", "local", "-q"))
    out = _ok(_tm(tok.parent, "legality", "build", "tokenizer.yaml", "-o", "s3://out/tables",
                  "-q", env=_env(s3, tmp_path)))
    assert "s3://out/tables/gpt2-tiny.legality" in out
    objects = s3.objects("out", "tables")
    assert sorted(objects) == ["gpt2-tiny.legality", "gpt2-tiny.prefix.npz"]
    (tmp_path / "got").mkdir()
    for name, blob in objects.items():
        (tmp_path / "got" / name).write_bytes(blob)
    got = LegalityTable.load(tmp_path / "got", mmap=False)
    want = LegalityTable.load(tok.parent / "local", mmap=False)
    assert np.array_equal(got.packed, want.packed) and got.identity == want.identity
    for name in ("gpt2-tiny.prefix.npz",):
        a, b = np.load(tmp_path / "got" / name), np.load(tok.parent / "local" / name)
        assert np.array_equal(a["parent"], b["parent"])


TRAIN = {"out_dir": "run", "model": "tiny", "seq_len": 64, "batch_size": 2, "steps": 3,
         "val_every": 3, "val_tokens": 256, "warmup_steps": 1, "device": "cpu",
         "num_threads": 1, "progress": False,
         "model_overrides": {"n_layer": 1, "n_embd": 64, "tie_embeddings": True}}


@pytest.mark.slow
def test_train_reads_its_data_from_a_bucket(s3, local_runs, tmp_path):
    """``train`` with ``data: s3://.../mix.json``: the shards are downloaded once into the
    node's cache (checked against their sha256) and the losses are the local run's."""
    for name, data in (("local", str(local_runs / "mixes" / "mix.json")),
                       ("bucket", "s3://runs/mixes/mix.json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.yaml").write_text(yaml.safe_dump(dict(TRAIN, data=data)))
        _ok(_tm(tmp_path / name, "train", "train.yaml", "-q", env=_env(s3, tmp_path)))
    got, want = (json.loads((tmp_path / n / "run" / "metrics.json").read_text())
                 for n in ("bucket", "local"))
    assert got["steps_done"] == 3 and got["train_loss"]
    assert got["train_loss"] == want["train_loss"]
    cached = list((tmp_path / "staging" / "cache" / "s3" / "runs" / "web").rglob("*.bin"))
    assert len(cached) == len(list((local_runs / "web").rglob("*.bin")))


def _one_line(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("args, url", [
    (("mix", "build", "s3://no-such-bucket/spec.yaml", "-o", "mix.json"),
     "s3://no-such-bucket/spec.yaml"),
    (("mix", "build", "s3://runs/specs/spec.yaml", "-o", "s3://no-such-bucket/m.json"),
     "s3://no-such-bucket/m.json"),
    (("shards", "export", "s3://no-such-bucket/mix.json", "--format", "olmo", "-o", "e"),
     "s3://no-such-bucket/mix.json"),
    (("shards", "export", "s3://runs/mixes/mix.json", "--format", "olmo", "-o",
      "s3://no-such-bucket/e"), "s3://no-such-bucket/e"),
    (("ngram", "build", "s3://no-such-bucket/web", "-o", "idx"), "s3://no-such-bucket/web"),
    (("ngram", "build", "s3://runs/web", "-o", "s3://no-such-bucket/idx"),
     "s3://no-such-bucket/idx"),
    (("legality", "build", "gpt2", "-o", "s3://no-such-bucket/t"), "s3://no-such-bucket/t"),
])
def test_a_missing_bucket_is_one_line_naming_the_url(s3, tmp_path, args, url):
    """An input or an output in a bucket that does not exist: one line naming its URL,
    exit 2, nothing written locally."""
    _one_line(_tm(tmp_path, *args, env=_env(s3, tmp_path)), url, "bucket does not exist")
    assert not [p for p in tmp_path.iterdir() if p.name != "staging"]


def test_train_data_in_a_missing_bucket_is_one_line(s3, tmp_path):
    """``train`` whose ``data:`` is in a bucket that does not exist: one line naming it."""
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(
        dict(TRAIN, data="s3://no-such-bucket/mix.json")))
    _one_line(_tm(tmp_path, "train", "train.yaml", "-q", env=_env(s3, tmp_path)),
              "s3://no-such-bucket/mix.json", "bucket does not exist")


def test_a_changed_object_is_refused_by_its_sha256(s3, local_runs, tmp_path):
    """A shard in the bucket rewritten after its manifest: refused naming its URL (the
    cache never hands out bytes the manifest does not record)."""
    shutil.copytree(local_runs / "web", tmp_path / "web")
    shard = sorted((tmp_path / "web" / "shards").rglob("train_0001.bin"))[0]
    blob = bytearray(shard.read_bytes())
    blob[-1] ^= 1
    shard.write_bytes(bytes(blob))
    s3.put_folder(tmp_path / "web", "out", "changed")
    r = _tm(tmp_path, "ngram", "build", "s3://out/changed", "-o", "idx",
            env=_env(s3, tmp_path))
    rel = shard.relative_to(tmp_path / "web").as_posix()
    _one_line(r, f"s3://out/changed/{rel}: sha256", "differs")


def test_cached_copies_keep_the_buckets_layout(tmp_path, monkeypatch):
    """A URL's cached copy maps back to the URL; a mix manifest names a shard in its own
    bucket relatively, one elsewhere by URL, and both are found again; a path that climbs
    above its bucket is refused."""
    from tokenmill import objectcache

    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    shard = objectcache.cache_path("s3://runs/web/shards/c4/train_0000.bin")
    assert shard == tmp_path / "cache" / "s3" / "runs" / "web" / "shards" / "c4" / \
        "train_0000.bin"
    assert objectcache.cached_url(shard) == "s3://runs/web/shards/c4/train_0000.bin"
    mixes = objectcache.cache_path("s3://runs/mixes")
    assert objectcache.relative(shard, mixes) == "../web/shards/c4/train_0000.bin"
    assert objectcache.locate(mixes, "../web/shards/c4/train_0000.bin") == shard
    other = objectcache.cache_path("s3://out/mixes")
    assert objectcache.relative(shard, other) == "s3://runs/web/shards/c4/train_0000.bin"
    assert objectcache.relative(shard, tmp_path / "local") == \
        "s3://runs/web/shards/c4/train_0000.bin"
    assert objectcache.locate(tmp_path, "s3://runs/web/shards/c4/train_0000.bin") == shard
    assert objectcache.relative(tmp_path / "a" / "x.bin", tmp_path / "b") == "../a/x.bin"
    assert objectcache.cached_url(tmp_path / "elsewhere.bin") is None
    with pytest.raises(ValueError, match="above it"):
        objectcache.cache_path("s3://runs/../../etc/passwd")


def test_no_credentials_and_a_refused_write_are_one_line(local_runs, tmp_path):
    """Against a server that checks every request (IAM): reading a curation output with
    no credentials in the environment, and a user allowed only to read who writes a mix
    manifest: each one line naming the URL, exit 2."""
    srv = S3Server(auth=True).start()
    try:
        srv.client().create_bucket(Bucket="runs")
        for folder in ("web", "specs"):
            srv.put_folder(local_runs / folder, "runs", folder)
        base = dict(os.environ, PYTHONPATH=str(REPO),
                    TOKENMILL_STAGING_DIR=str(tmp_path / "staging"))
        r = _tm(tmp_path, "ngram", "build", "s3://runs/web", "-o", "idx",
                env=srv.env(None, base=base))
        _one_line(r, "s3://runs/web", "no credentials")
        r = _tm(tmp_path, "mix", "build", "s3://runs/specs/spec.yaml", "-o",
                "s3://runs/mixes/denied.json", env=srv.env("reader", base=base))
        _one_line(r, "s3://runs/mixes/denied.json", "access denied")
    finally:
        srv.stop()
