"""Crashes lose nothing and redo little: SIGKILL of the whole run at random moments, a Ray
worker killed mid-task, and block-level resume."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import final_files, shutdown_ray
from tests.shared import corpora
from tokenmill.pipeline.config import DatamixConfig, load_datamix
from tokenmill.pipeline.run.executor import run_datamix

REPO = Path(__file__).resolve().parents[2]




KILL_MIX = """\
name: killed
tokenizer: gpt2
block_documents: 150
sources:
  - {name: c4, path: c4-en-sample}
  - {name: cc, path: cc-main-2019-sample, document_license: cc-attributes}
  - {name: books, path: books-public-domain, quality_filters: false}
licenses:
  allow: [odc-by, public-domain]
  document_deny_terms: [nc, nd]
quality: {gopher_quality: {}, gopher_repetition: {}, c4: {}, fineweb: {}}
fuzzy_dedup: {}
"""


@pytest.mark.slow
def test_sigkill_at_five_random_moments(tmp_path):
    """A run of every stage (14 blocks) killed (SIGKILL, whole process group: driver and
    Ray) at 5 moments spread over its stages; each rerun completes with byte-identical
    output. The datamix is a third of the quickstart, so five kills fit in about a minute."""
    spec = tmp_path / "killed.yaml"
    spec.write_text(KILL_MIX)
    reference_run = run_datamix(load_datamix(spec, data_root=str(corpora()),
                                             output_dir=str(tmp_path / "ref")), progress=False)
    reference = final_files(tmp_path / "ref")
    rng = random.Random(20240520)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "tokenmill.cli", "run", str(spec), "--no-report",
           "--data-root", str(corpora()), "--num-cpus", "2", "-o", str(tmp_path / "out")]
    # place the kills over the whole run: its in-process time plus process and Ray startup
    total = reference_run.seconds + 4.0
    report = []
    for i in range(5):
        subprocess.run(["rm", "-rf", str(tmp_path / "out")], check=True)
        moment = (i + rng.random()) / 5 * total
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        time.sleep(moment)
        os.killpg(p.pid, signal.SIGKILL)
        log = p.communicate()[0]
        stage = [s for s in ("write shards", "tokenize", "dedup", "read+normalize")
                 if s in log]
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        reused = next(line for line in r.stdout.splitlines() if line.startswith("blocks:"))
        report.append(f"kill {i + 1} at {moment:5.1f}s of {total:.1f}s "
                      f"(reached: {stage[0] if stage else 'startup'}): rerun {reused}")
        assert final_files(tmp_path / "out") == reference, report[-1]
    print("\n".join(report))


def _small_cfg(out: Path, **kw) -> DatamixConfig:
    return DatamixConfig(name="small", data_root=str(corpora()), output_dir=str(out),
                         sources=[{"name": "c4", "path": "c4-en-sample"},
                                  {"name": "books", "path": "books-public-domain"}], **kw)


def test_blocks_resume_and_do_not_change_output(tmp_path):
    whole = run_datamix(_small_cfg(tmp_path / "a"), num_cpus=1, progress=False)
    blocked = run_datamix(_small_cfg(tmp_path / "b", block_documents=100), num_cpus=1,
                          progress=False)
    assert blocked.total_units == 10 + 1  # c4: 1000 rows in blocks of 100; books: one unit
    assert final_files(tmp_path / "a") == final_files(tmp_path / "b")
    # lose the last 3 blocks of c4 as a crash would (their done records never written)
    work = tmp_path / "b" / "work" / "prepare"
    done = sorted(work.glob("*.done.json"), key=lambda p: p.stat().st_mtime_ns)
    c4_blocks = [p for p in done if '"read": 100' in p.read_text()]
    for p in c4_blocks[-3:]:
        p.unlink()
    again = run_datamix(_small_cfg(tmp_path / "b", block_documents=100), num_cpus=1,
                        progress=False)
    assert again.reused_units == again.total_units - 3
    assert final_files(tmp_path / "a") == final_files(tmp_path / "b")
    del whole


@pytest.mark.slow
def test_worker_killed_during_tokenization(tmp_path):
    """A worker running a tokenize task, found through Ray's state API and SIGKILLed, is
    retried by Ray; the output equals an undisturbed run."""
    import ray
    from ray.util.state import list_tasks

    reference_run = run_datamix(_small_cfg(tmp_path / "ref", block_documents=250), num_cpus=2,
                                progress=False)
    reference = final_files(reference_run.manifest_path.parent)
    shutdown_ray()
    ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False,
             runtime_env={"env_vars": {"TOKENMILL_TASK_DELAY_S": "2",
                                       "TIKTOKEN_CACHE_DIR": os.environ["TIKTOKEN_CACHE_DIR"]}})
    killed: list[int] = []
    try:
        result: dict = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "r", run_datamix(_small_cfg(tmp_path / "out", block_documents=250), progress=False)))
        t.start()
        gcs = ray.get_runtime_context().gcs_address
        deadline = time.time() + 120
        while not killed and time.time() < deadline and t.is_alive():
            try:
                running = list_tasks(address=gcs, filters=[("name", "=", "tokenize_block"),
                                                           ("state", "=", "RUNNING")])
            except Exception:
                running = []
            for task in running:
                pid = getattr(task, "worker_pid", None)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
            time.sleep(0.2)
        t.join(timeout=300)
    finally:
        ray.shutdown()
    assert killed, "no running tokenize task was found to kill"
    assert "r" in result
    assert final_files(tmp_path / "out") == reference
    print(f"killed worker pid {killed[0]} during tokenize_block; output unchanged")
    json.dumps(killed)
