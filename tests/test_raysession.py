"""The one Ray bootstrap: quiet for the embedded local Ray, and nothing outlives a killed driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DRIVER = """
import sys, time
from tokenmill.raysession import init_ray
import ray
init_ray(num_cpus=2)

@ray.remote
def busy(path):
    import time
    while True:  # a worker that would go on writing into the output folder
        with open(path, "a") as f:
            f.write("x")
        time.sleep(0.05)

refs = [busy.remote(sys.argv[1] + f"/w{i}") for i in range(2)]
print("ready", flush=True)
time.sleep(600)
"""


def _session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (the driver, Ray's head processes and its workers)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


def test_killed_driver_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    err = (tmp_path / "stderr").open("w")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(out)], stdout=subprocess.PIPE,
                            stderr=err, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready", (tmp_path / "stderr").read_text()
        deadline = time.monotonic() + 120
        while len(list(out.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # both workers are writing
        assert len(list(out.iterdir())) == 2
        assert len(_session_pids(proc.pid)) >= 4  # driver, gcs, raylet, workers
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while _session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _session_pids(proc.pid) == [], "processes outlived the killed driver"
        sizes = {p: p.stat().st_size for p in out.iterdir()}
        time.sleep(0.5)
        assert sizes == {p: p.stat().st_size for p in out.iterdir()}, "still being written"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in _session_pids(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_embedded_ray_prints_no_auth_notice() -> None:
    code = ("from tokenmill.raysession import ray_session\nimport ray\n"
            "with ray_session(num_cpus=1):\n    print(ray.get(ray.remote(lambda: 6 * 7).remote()))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "42"
    assert "Token authentication" not in res.stdout + res.stderr
