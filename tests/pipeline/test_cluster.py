"""A real two-node Ray cluster on loopback: `ray start --head` and `ray start --address`
as separate processes with their own resources; `tokenmill run --ray-address` runs the
full quickstart, the partitioned exact and fuzzy dedup included, and gives shards and a
manifest byte-identical to the embedded single-node run."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import final_files
from tests.shared import corpora

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




@pytest.mark.slow
def test_two_node_loopback_cluster(quickstart, tmp_path):
    ray_bin = Path(sys.executable).parent / "ray"
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # Ray's token authentication is for clusters reachable from other machines; this one
    # lives on this machine alone (Ray advertises the host's own address for 127.0.0.1).
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
              "--disable-usage-stats"]
    # a short temp dir: Ray's unix socket paths must fit in 107 bytes
    temp = tempfile.mkdtemp(prefix="tmr", dir="/tmp")
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--port", str(port), "--include-dashboard", "false",
         "--temp-dir", temp, *common],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        _wait_nodes(address, 1, env)
        worker = subprocess.Popen(
            [str(ray_bin), "start", "--address", address, *common],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_nodes(address, 2, env)
        out = tmp_path / "out"
        # another dedup partition count than the embedded run's default: same bytes
        datamix = tmp_path / "quickstart.yaml"
        shutil.copytree(REPO / "manifests" / "blocklists", tmp_path / "blocklists")
        datamix.write_text((REPO / "manifests" / "quickstart.yaml").read_text()
                           + "dedup:\n  partitions: 5\n")
        r = subprocess.run(
            [sys.executable, "-m", "tokenmill.cli", "run", str(datamix), "-q",
             "--data-root", str(corpora()), "--ray-address", address, "-o", str(out)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert final_files(out) == final_files(quickstart.manifest_path.parent)
        # the dedup decisions ran as partition tasks on the cluster, not on the driver
        for phase in ("exact", "fuzzy_buckets", "fuzzy_verify", "join", "removals"):
            assert list((out / "work" / "dedup" / phase).glob("*.done.json")), phase
    finally:
        for p in (worker, head):
            if p is not None:
                p.terminate()  # `ray start --block` stops its node's processes on SIGTERM
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
        shutil.rmtree(temp, ignore_errors=True)
        # `ray start --head` records itself as this machine's default cluster; forget it
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if current.exists() and str(port) in current.read_text():
            current.unlink()


def _wait_nodes(address: str, n: int, env: dict, timeout: float = 180) -> None:
    code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(sum(1 for x in ray.nodes() if x['Alive']))")
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        try:
            r = subprocess.run([sys.executable, "-c", code, address], env=env,
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            continue
        last = r.stdout.strip() + r.stderr[-500:]
        if r.stdout.strip().isdigit() and int(r.stdout.strip()) >= n:
            return
        time.sleep(1)
    raise AssertionError(f"cluster at {address} did not reach {n} nodes: {last}")
