"""`tokenmill run` with its data and its output in an S3 bucket: a real S3-compatible
server on 127.0.0.1 (moto's server mode, :mod:`tests.s3server`) reached by tokenmill's own
client, through the command a user types.

The bucket run gives the bytes of the local run (the manifest differs only in the sources'
``origin``, their URLs), commits every work output by a record written after it, resumes
from the bucket alone (a fresh staging folder: another machine), and a bucket that does not
exist, missing credentials and a refused write are each one line naming the URL.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPORT_FILES, final_files
from tests.s3server import S3Server
from tests.shared import corpora

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("c4-en-sample", "cc-main-2019-sample")

MIX = """\
name: small
tokenizer: gpt2
block_documents: 150
sources:
  - {name: c4, path: c4-en-sample, max_documents: 400}
  - {name: cc, path: cc-main-2019-sample, document_license: cc-attributes,
     max_documents: 200}
licenses:
  allow: [odc-by]
  document_deny_terms: [nc, nd]
quality: {gopher_quality: {}, c4: {}}
fuzzy_dedup: {}
"""


def _upload_corpora(srv: S3Server) -> None:
    s3 = srv.client()
    for bucket in ("data", "runs"):
        s3.create_bucket(Bucket=bucket)
    for name in SOURCES:
        srv.put_folder(corpora(name), "data", f"corpora/{name}")


@pytest.fixture(scope="module")
def s3():
    corpora(SOURCES[0])  # skips without the shared data
    srv = S3Server().start()
    try:
        _upload_corpora(srv)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def s3_auth():
    """A server that checks every request against IAM: an ``admin`` and a ``reader``."""
    corpora(SOURCES[0])
    srv = S3Server(auth=True).start()
    try:
        _upload_corpora(srv)
        yield srv
    finally:
        srv.stop()


def _cmd(mix: Path, data_root: str, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", "run", str(mix), "--num-cpus", "1", "-q",
            "--no-report", "--data-root", data_root, "-o", out, *extra]


def _env(srv: S3Server, staging: Path, user: str | None = "admin", **more: str) -> dict:
    return srv.env(user, base=dict(os.environ, PYTHONPATH=str(REPO),
                                   TOKENMILL_STAGING_DIR=str(staging), **more))


def _bucket_final(srv: S3Server, prefix: str) -> dict[str, bytes]:
    return {k: v for k, v in srv.objects("runs", prefix).items()
            if not k.startswith("work/") and k and not k.endswith("/")
            and k not in REPORT_FILES}  # stats.json's times differ between runs


def _without_origins(blob: bytes) -> tuple[dict, list[str]]:
    m = json.loads(blob)
    origins = [s.pop("origin") for s in m["sources"]]
    return m, origins


def _card(files: dict[str, bytes]) -> bytes:
    """The Hub-layout text's card with the sources' origins and its manifest's sha256
    (which differs by them) left out."""
    sha = hashlib.sha256(files["manifest.json"]).hexdigest().encode()
    card = files.get("text/README.md", b"").replace(sha, b"MANIFEST")
    for s in SOURCES:
        card = card.replace(f"s3://data/corpora/{s}".encode(), s.encode())
    return card


def _assert_same_as_local(local: dict[str, bytes], bucket: dict[str, bytes]) -> None:
    assert sorted(bucket) == sorted(local)
    for name in local:
        if name not in ("manifest.json", "text/README.md"):
            assert bucket[name] == local[name], name
    assert _card(bucket) == _card(local)
    lm, lo = _without_origins(local["manifest.json"])
    bm, bo = _without_origins(bucket["manifest.json"])
    assert bm == lm
    assert lo == list(SOURCES)
    assert bo == [f"s3://data/corpora/{s}" for s in SOURCES]


def _committed_work(objects: dict[str, bytes]) -> int:
    """Check that every work output's done record lists objects present with its sha256;
    returns the number of records."""
    records = [k for k in objects if k.startswith("work/") and k.endswith(".done.json")]
    for rec in records:
        folder = rec.rsplit("/", 1)[0]
        for name, sha in json.loads(objects[rec])["files"].items():
            assert hashlib.sha256(objects[f"{folder}/{name}"]).hexdigest() == sha, name
    return len(records)


@pytest.mark.slow
def test_bucket_to_bucket_run_is_the_local_run(s3, tmp_path):
    """Sources and output in the bucket, with the Hub-layout text: shards, sidecars,
    quarantine, text and manifest are the local run's bytes (sources recorded by their
    URL); every work output is committed by its done record; no lock object is left."""
    mix = tmp_path / "small.yaml"
    mix.write_text(MIX)
    r = subprocess.run(_cmd(mix, str(corpora()), str(tmp_path / "local"), "--write-text"),
                       cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(_cmd(mix, "s3://data/corpora", "s3://runs/small", "--write-text"),
                       cwd=REPO, env=_env(s3, tmp_path / "staging"), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "manifest: s3://runs/small/manifest.json" in r.stdout
    _assert_same_as_local(final_files(tmp_path / "local"), _bucket_final(s3, "small"))
    objects = s3.objects("runs", "small")
    assert _committed_work(objects) > 10
    assert ".tokenmill.lock" not in objects


def _one_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_bucket_errors_are_one_line_naming_the_url(s3_auth, tmp_path):
    """Against a server that checks credentials and IAM policies: an output bucket and a
    source bucket that do not exist, no credentials at all, and a user allowed only to
    read who asks to write the output: each one line naming the URL, exit 2, before any
    work."""
    mix = tmp_path / "small.yaml"
    mix.write_text(MIX)

    def run(user: str | None, data_root: str, out: str) -> subprocess.CompletedProcess:
        return subprocess.run(_cmd(mix, data_root, out), cwd=REPO,
                              env=_env(s3_auth, tmp_path / "staging", user),
                              capture_output=True, text=True, timeout=300)

    _one_line(run("admin", "s3://data/corpora", "s3://no-such-bucket/out"),
              "s3://no-such-bucket/out", "bucket does not exist")
    _one_line(run("admin", "s3://no-such-data/corpora", "s3://runs/e"),
              "s3://no-such-data/corpora/c4-en-sample", "bucket does not exist")
    _one_line(run(None, "s3://data/corpora", "s3://runs/e"), "s3://runs/e",
              "no credentials")
    _one_line(run("reader", "s3://data/corpora", "s3://runs/e"), "s3://runs/e",
              "access denied")


KILL_MIX = MIX.replace("block_documents: 150", "block_documents: 50")


@pytest.mark.slow
def test_sigkill_mid_bucket_run_then_rerun_elsewhere(s3, tmp_path):
    """A bucket run SIGKILLed (driver and Ray together) once some blocks are committed,
    rerun from a fresh staging folder (as on another machine: only the bucket holds the
    earlier work), gives the bytes of an uninterrupted local run and reuses the committed
    blocks; the killed run's lock object is taken over as stale."""
    mix = tmp_path / "killed.yaml"
    mix.write_text(KILL_MIX)
    r = subprocess.run(_cmd(mix, str(corpora()), str(tmp_path / "local")), cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    cmd = _cmd(mix, "s3://data/corpora", "s3://runs/killed")
    p = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL,
                         env=_env(s3, tmp_path / "staging1", TOKENMILL_TASK_DELAY_S="1"))
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        done = [k for k in s3.objects("runs", "killed/work/prepare")
                if k.endswith(".done.json")]
        if len(done) >= 3:
            break
        time.sleep(0.5)
    assert p.poll() is None, "the run ended before it could be killed"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert "manifest.json" not in _bucket_final(s3, "killed")
    r = subprocess.run(cmd, cwd=REPO, env=_env(s3, tmp_path / "staging2"),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    blocks = next(line for line in r.stdout.splitlines() if line.startswith("blocks:"))
    assert "prepare 0/" not in blocks, blocks  # committed blocks were reused
    _assert_same_as_local(final_files(tmp_path / "local"), _bucket_final(s3, "killed"))


def test_bucket_output_lock_refuses_a_second_run(s3, tmp_path):
    """An output folder in the bucket whose lock object names a live run (this test's
    process) is refused in one line naming the folder and the holder, before any work;
    the lock object is left as it was."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": "then",
              "command": "tokenmill run other.yaml"}
    s3.client().put_object(Bucket="runs", Key="locked/.tokenmill.lock",
                           Body=json.dumps(holder).encode())
    mix = tmp_path / "small.yaml"
    mix.write_text(MIX)
    r = subprocess.run(_cmd(mix, "s3://data/corpora", "s3://runs/locked"), cwd=REPO,
                       env=_env(s3, tmp_path / "staging"), capture_output=True, text=True)
    _one_line(r, "s3://runs/locked is in use by another run", f"pid {os.getpid()}",
              "tokenmill run other.yaml")
    assert json.loads(s3.objects("runs", "locked")[".tokenmill.lock"]) == holder


def test_messages_never_name_credentials():
    """A URL's ``user:password@`` part is left out of every storage error line."""
    from tokenmill import storage

    assert storage.redact("see https://me:s3cret@host/x and s3://b/k") == \
        "see https://host/x and s3://b/k"
    line = str(storage.error("https://me:s3cret@host/x",
                             OSError("denied https://me:s3cret@host/x"), "read"))
    assert "s3cret" not in line and line.startswith("https://host/x: cannot read")
