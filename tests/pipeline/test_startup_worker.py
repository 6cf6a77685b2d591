"""The startup worker: a forked process that runs the first tasks while Ray starts, from
the end of the submission order, until it is stopped; its results, its errors, and its end
with the driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenmill.pipeline.run.startup_worker import StartupWorker

REPO = Path(__file__).resolve().parents[2]


def slow_square(x: int) -> int:
    time.sleep(0.05)
    if x == 99:
        raise ValueError("bad row 7 in data/part-99.jsonl")
    return x * x


def test_takes_tasks_from_the_end_until_stopped():
    specs = list(range(40))
    order = list(range(40))
    with StartupWorker(slow_square, specs, order) as w:
        time.sleep(0.6)
        taken = w.stop()
        assert w.stop() == taken  # stopping twice changes nothing
        assert 1 <= len(taken) < 40
        assert taken == order[len(order) - len(taken):]  # the smallest units: the end
        assert w.results() == {i: i * i for i in taken}


def test_disabled_or_single_task_takes_nothing():
    for worker in (StartupWorker(slow_square, [1, 2, 3], [0, 1, 2], enabled=False),
                   StartupWorker(slow_square, [1], [0])):
        with worker as w:
            time.sleep(0.2)
            assert w.stop() == [] and w.results() == {}


def test_an_error_in_a_task_is_raised_by_results():
    specs = [1, 2, 99]
    with StartupWorker(slow_square, specs, [0, 1, 2]) as w:
        time.sleep(0.5)
        w.stop()
        with pytest.raises(ValueError, match="bad row 7 in data/part-99.jsonl"):
            w.results()


def sleep_long(x: int) -> int:
    time.sleep(60)
    return x


def test_leaving_with_an_error_stops_the_worker():
    with pytest.raises(KeyboardInterrupt):
        with StartupWorker(sleep_long, [1, 2], [0, 1]) as w:
            time.sleep(0.3)
            pid = w._proc.pid
            raise KeyboardInterrupt
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_the_worker_dies_with_a_killed_driver(tmp_path):
    script = (
        "import sys, time\n"
        "from tests.pipeline.test_startup_worker import sleep_long\n"
        "from tokenmill.pipeline.run.startup_worker import StartupWorker\n"
        "with StartupWorker(sleep_long, [1, 2], [0, 1]) as w:\n"
        "    print(w._proc.pid, flush=True)\n"
        "    time.sleep(60)\n")
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    pid = int(driver.stdout.readline())
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the startup worker outlived its killed driver")


class NeedsTwoArgs(Exception):
    def __init__(self, path: str, row: int) -> None:
        super().__init__(f"{path}: row {row} is not JSON")


def fails_oddly(x: int) -> int:
    raise NeedsTwoArgs("data/a.jsonl", x)


def test_an_error_that_does_not_unpickle_arrives_as_its_text():
    with StartupWorker(fails_oddly, [3, 4], [0, 1]) as w:
        time.sleep(0.3)
        w.stop()
        with pytest.raises(RuntimeError, match="NeedsTwoArgs: data/a.jsonl: row 4 is not JSON"):
            w.results()
