"""A Ray head node on loopback for tests: ``ray start --head --block`` in its own session
with its own short temp folder (``RAY_TMPDIR``) and free ports, stopped afterwards."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RAY_BIN = Path(sys.executable).parent / "ray"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class HeadNode:
    address: str  # GCS HOST:PORT
    dashboard: str  # job API URL, http://HOST:PORT
    temp_dir: Path  # the node's --temp-dir (its session folders live here)
    env: dict[str, str]  # environment the node was started with (RAY_TMPDIR: its parent)


def wait_nodes(address: str, n: int, env: dict, timeout: float = 180) -> None:
    """Wait until the cluster at ``address`` has ``n`` live nodes."""
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


@contextmanager
def head_node(env: dict[str, str], num_cpus: int = 2, dashboard: bool = False,
              cwd: Path | None = None) -> Iterator[HeadNode]:
    """A running one-node cluster on 127.0.0.1 (with the job API when ``dashboard``),
    its processes started in ``cwd`` (default: this process's working folder)."""
    port, dash_port = free_port(), free_port()
    # Ray's token authentication is for clusters reachable from other machines; this one
    # lives on this machine alone
    # a short temp dir (Ray's unix socket paths must fit in 107 bytes), and RAY_TMPDIR naming
    # it: `ray start` records the cluster there (TMP/ray/ray_current_cluster), where a driver
    # with the same RAY_TMPDIR finds it for `auto`, whatever other Rays this machine runs
    base = Path(tempfile.mkdtemp(prefix="tmr", dir="/tmp"))
    temp = base / "ray"
    env = dict(env, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
               RAY_TMPDIR=str(base))
    ports = ["--dashboard-port", str(dash_port), "--dashboard-host", "127.0.0.1",
             "--dashboard-agent-listen-port", str(free_port()),
             "--dashboard-agent-grpc-port", str(free_port()),
             "--metrics-export-port", str(free_port()),
             "--ray-client-server-port", str(free_port())]
    head = subprocess.Popen(
        [str(RAY_BIN), "start", "--head", "--block", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus),
         "--disable-usage-stats", "--temp-dir", str(temp),
         "--include-dashboard", "true" if dashboard else "false", *ports],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=cwd)
    address = f"127.0.0.1:{port}"
    try:
        wait_nodes(address, 1, env)
        yield HeadNode(address, f"http://127.0.0.1:{dash_port}", temp, env)
    finally:
        _stop(head)
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def worker_node(address: str, env: dict[str, str], temp_dir: Path, cwd: Path,
                num_cpus: int = 1, nodes: int = 2) -> Iterator[None]:
    """One more node joined to the cluster at ``address`` (``ray start --address``), with
    its own environment, ``--temp-dir`` and working folder; returns once the cluster has
    ``nodes`` live nodes."""
    node = subprocess.Popen(
        [str(RAY_BIN), "start", "--address", address, "--block", "--node-ip-address",
         "127.0.0.1", "--num-cpus", str(num_cpus), "--disable-usage-stats",
         "--temp-dir", str(temp_dir), "--dashboard-agent-listen-port", str(free_port()),
         "--dashboard-agent-grpc-port", str(free_port()),
         "--metrics-export-port", str(free_port())],
        env=dict(env, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
    try:
        wait_nodes(address, nodes, env)
        yield
    finally:
        _stop(node)


def _stop(node: subprocess.Popen) -> None:
    node.terminate()  # `ray start --block` stops its node's processes on SIGTERM
    try:
        node.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(node.pid, 9)
