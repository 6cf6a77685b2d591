"""Ray's own way in: ``ray job submit -- tokenmill run ...`` to a ``ray start --head``
cluster on loopback runs on that cluster (the driver joins it through the ``RAY_ADDRESS``
the job API sets, it does not start an embedded Ray), and ``--ray-address auto`` joins the
cluster ``ray start`` made on this machine; both give the embedded run's bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import final_files
from tests.raycluster import RAY_BIN, head_node
from tests.shared import corpora

REPO = Path(__file__).resolve().parents[1]

# the cluster's tasks of one job, asked of the cluster's state API (the job API's address)
_TASKS = """
import sys
from ray.util.state import list_jobs, list_tasks
dash, key = sys.argv[1], sys.argv[2]
every = list_jobs(address=dash)
jobs = [j for j in every if j.job_id and any(key in (s or "") for s in (j.submission_id,
                                                                        j.entrypoint))]
print([(j.job_id, j.submission_id, j.type, j.entrypoint) for j in every], file=sys.stderr)
print(len(jobs), sum(len(list_tasks(address=dash, filters=[("job_id", "=", j.job_id)],
                                    limit=10000)) for j in jobs))
"""


def _datamix(tmp_path: Path) -> Path:
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"name: jobmix\ntokenizer: gpt2\ndata_root: {corpora()}\n"
                   "licenses: {allow: [odc-by]}\nsources:\n"
                   "  - {name: c4, path: c4-en-sample, max_documents: 300}\n")
    return mix


def _cluster_tasks(dash: str, key: str, env: dict) -> tuple[int, int]:
    """(jobs matching ``key``, tasks they ran) on the cluster behind ``dash``: one job, and it
    ran tasks there (every job of the cluster is listed on stderr when not)."""
    r = subprocess.run([sys.executable, "-c", _TASKS, dash, key], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    jobs, tasks = r.stdout.split()
    assert int(jobs) == 1 and int(tasks) > 0, f"{key}: {r.stdout} {r.stderr[-2000:]}"
    return int(jobs), int(tasks)


@pytest.mark.slow
def test_ray_job_submit_and_auto_join_the_cluster(tmp_path):
    mix = _datamix(tmp_path)
    cli = [sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q", "--no-report"]
    base = {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "TOKENMILL_RAY_ADDRESS")}
    env = dict(base, PYTHONPATH=str(REPO))  # the job's entrypoint inherits the node's
    embedded = subprocess.run([*cli, "--num-cpus", "2", "-o", str(tmp_path / "embedded")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert embedded.returncode == 0, embedded.stderr
    with head_node(env, num_cpus=2, dashboard=True) as head:
        sid = f"tokenmill-{uuid.uuid4().hex[:8]}"
        job_out = tmp_path / "job"
        # no --working-dir: nothing is uploaded; the entrypoint names absolute paths
        r = subprocess.run(
            [str(RAY_BIN), "job", "submit", "--address", head.dashboard, "--submission-id",
             sid, "--", *cli, "-o", str(job_out)],
            cwd=tmp_path, env=head.env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"Job '{sid}' succeeded" in r.stdout + r.stderr
        assert "Started a local Ray instance" not in r.stdout + r.stderr
        _cluster_tasks(head.dashboard, sid, head.env)  # the run's tasks ran on this cluster
        # a driver on this machine, outside the job API: `auto` finds the same cluster
        auto_out = tmp_path / "auto"
        a = subprocess.run([*cli, "--ray-address", "auto", "-o", str(auto_out)],
                           cwd=REPO, env=head.env, capture_output=True, text=True, timeout=600)
        assert a.returncode == 0, a.stderr
        _cluster_tasks(head.dashboard, str(auto_out), head.env)
    for out in (job_out, auto_out):
        v = subprocess.run([sys.executable, "-m", "tokenmill.cli", "manifest", "validate",
                            str(out / "manifest.json")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
        assert v.returncode == 0, v.stdout + v.stderr
        assert final_files(out) == final_files(tmp_path / "embedded")
