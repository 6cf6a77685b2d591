"""The one Ray bootstrap: quiet for the embedded local Ray, and nothing outlives a killed driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# one driver serves both tests (a Ray start costs seconds): it starts the embedded Ray the
# way every command does, runs a task, then keeps two workers writing until it is killed
DRIVER = """
import sys, time
from tokenmill.raysession import ray_session
import ray
session = ray_session(num_cpus=2)
session.__enter__()
print(ray.get(ray.remote(lambda: 6 * 7).remote()), flush=True)

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


@pytest.fixture(scope="module")
def killed_driver(tmp_path_factory) -> dict:
    """Run DRIVER, SIGKILL its process group while its workers write, and record what
    happened: its first stdout line, its stderr, the session's processes before and after
    the kill, and whether the output files still grew afterwards."""
    tmp = tmp_path_factory.mktemp("raysession")
    out = tmp / "out"
    out.mkdir()
    err_path = tmp / "stderr"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(out)], stdout=subprocess.PIPE,
                            stderr=err_path.open("w"), text=True, start_new_session=True)
    seen: dict = {}
    try:
        seen["result"] = proc.stdout.readline().strip()
        seen["ready"] = proc.stdout.readline().strip()
        deadline = time.monotonic() + 120
        while len(list(out.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # both workers are writing
        seen["writers"] = len(list(out.iterdir()))
        seen["before"] = len(_session_pids(proc.pid))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while _session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.25)
        seen["after"] = _session_pids(proc.pid)
        sizes = {p: p.stat().st_size for p in out.iterdir()}
        time.sleep(0.5)
        seen["still_written"] = sizes != {p: p.stat().st_size for p in out.iterdir()}
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
    seen["stdout_stderr"] = f"{seen.get('result')}\n{seen.get('ready')}\n{err_path.read_text()}"
    return seen


# the killed driver starts and kills a Ray of its own: slow, in `.ci/run`
@pytest.mark.slow
def test_killed_driver_leaves_nothing_running(killed_driver: dict) -> None:
    assert killed_driver["ready"] == "ready", killed_driver["stdout_stderr"]
    assert killed_driver["writers"] == 2
    assert killed_driver["before"] >= 4  # driver, gcs, raylet, workers
    assert killed_driver["after"] == [], "processes outlived the killed driver"
    assert not killed_driver["still_written"], "still being written"


@pytest.mark.slow
def test_embedded_ray_prints_no_auth_notice(killed_driver: dict) -> None:
    assert killed_driver["result"] == "42", killed_driver["stdout_stderr"]
    assert "Token authentication" not in killed_driver["stdout_stderr"]


def _square(x: int) -> int:
    import time

    time.sleep(0.2 * (x % 3))  # finish out of order
    return x * x


# long enough for a cancel to reach a running task on a loaded machine (two cores
# shared by Ray's processes and other tests): a cancel is delivered, not instant
MARK_AFTER_S = 8.0


def _fail_or_mark(x: int, marker: str) -> int:
    import time

    if x == 0:
        raise ValueError("task 0 fails")
    time.sleep(MARK_AFTER_S)
    Path(marker).write_text("ran to the end")
    return x


@pytest.fixture(scope="module")
def ray_up():
    """One embedded Ray (2 CPUs) for the task-runner tests."""
    from tokenmill.raysession import ray_session

    with ray_session(num_cpus=2):
        yield


def _power(x: int, *, exponent: int) -> int:
    return x ** exponent


def _total(values) -> int:
    return int(values.sum())


def test_run_tasks_orders_results_and_reports_progress(ray_up) -> None:
    from tokenmill.raysession import TaskCall, run_tasks

    calls = [TaskCall(_square, (i,), {"num_cpus": 1}) for i in range(6)]
    seen: list[int] = []
    assert list(run_tasks(calls, on_done=lambda i, r: seen.append(i))) == [
        i * i for i in range(6)]
    assert sorted(seen) == list(range(6))
    assert sorted(run_tasks(calls, ordered=False)) == [(i, i * i) for i in range(6)]


# the cancel tests wait for a cancelled task's time to run out: slow, in `.ci/run`
@pytest.mark.slow
def test_run_tasks_cancels_pending_tasks_on_error(tmp_path, ray_up) -> None:
    from tokenmill.raysession import TaskCall, run_tasks

    marker = tmp_path / "marker"
    with pytest.raises(Exception, match="task 0 fails"):
        list(run_tasks([TaskCall(_fail_or_mark, (i, str(marker))) for i in range(2)]))
    time.sleep(MARK_AFTER_S + 1.5)  # the cancelled task would have written by now
    assert not marker.exists(), "a pending task went on after the error"


def test_task_pool_collects_by_handle(ray_up) -> None:
    import numpy as np

    from tokenmill.raysession import TaskCall, TaskPool, put_shared

    with TaskPool() as pool:
        squares = [pool.submit(TaskCall(_square, (i,), {"num_cpus": 1})) for i in range(3)]
        power = pool.submit(TaskCall(_power, (3,), kwargs={"exponent": 3}))
        assert [pool.result(h) for h in reversed(squares)] == [4, 1, 0]
        assert pool.next_done() == (power, 27) and len(pool) == 0
        ref = put_shared(np.arange(5))
        assert pool.result(pool.submit(TaskCall(_total, (ref,)))) == 10


@pytest.mark.slow
def test_task_pool_cancels_what_is_not_read(tmp_path, ray_up) -> None:
    from tokenmill.raysession import TaskCall, TaskPool

    marker = tmp_path / "marker"
    with TaskPool() as pool:
        skipped = pool.submit(TaskCall(_fail_or_mark, (1, str(marker))))
        pool.cancel(skipped)
        assert skipped not in pool
        with pytest.raises(KeyError):
            pool.result(skipped)
        pool.submit(TaskCall(_fail_or_mark, (2, str(marker))))
    time.sleep(MARK_AFTER_S + 1.5)  # a task left running would have written by now
    assert not marker.exists(), "a cancelled task ran to the end"


BEHIND = """
import ray
from tokenmill import raysession
with raysession.ray_session(num_cpus=1, shutdown_behind=True):
    print(ray.get(ray.remote(lambda: 6 * 7).remote()), flush=True)
print("behind", raysession._shutting_down is not None, flush=True)
with raysession.ray_session(num_cpus=1):  # waits for the first shutdown, then starts anew
    print(ray.get(ray.remote(lambda: 7 * 8).remote()), flush=True)
"""


@pytest.mark.slow
def test_shutdown_behind_the_caller_is_waited_for_by_the_next_session_and_the_exit():
    proc = subprocess.Popen([sys.executable, "-c", BEHIND], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.split() == ["42", "behind", "True", "56"]
    # the driver waited for both shutdowns before it exited: nothing of its session is left
    deadline = time.monotonic() + 10
    while _session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _session_pids(proc.pid) == [], "Ray processes outlived the driver"


def test_workers_allocate_arrow_buffers_with_the_system_allocator(ray_up) -> None:
    """A task's pyarrow buffers come from malloc, as the driver's (see
    ``tokenmill._arrow_on_the_system_allocator``)."""
    import ray

    @ray.remote
    def backend() -> str:
        import pyarrow as pa

        import tokenmill  # noqa: F401  (what a tokenmill task's unpickling imports)
        return pa.default_memory_pool().backend_name

    assert ray.get(backend.remote()) == "system"
