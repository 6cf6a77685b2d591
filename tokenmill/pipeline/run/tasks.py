"""The pipeline's two ways of running its tasks on Ray, both through
:func:`tokenmill.raysession.run_tasks` with a progress bar:

* :func:`run_each`: one Ray task per spec (a unit to prepare, a block to tokenize, a
  source to write), results in spec order (:func:`run_each_timed`: with each task's CPU
  seconds), the first ones possibly run while Ray started
  (:class:`~tokenmill.pipeline.run.startup_worker.StartupWorker`);
* :func:`run_batches`: specs grouped into about four Ray tasks per cluster CPU (the
  global stages' map and reduce phases, many small tasks), results in spec order, and
  the largest peak RSS of a task of each description in :data:`TASK_PEAK_RSS`, and
  their CPU seconds in :data:`TASK_CPU_SECONDS`.

A spec is a frozen dataclass (picklable); the task function is a plain module-level
function of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from tokenmill.pipeline.run.startup_worker import StartupWorker
from tokenmill.raysession import TaskCall, cluster_cpus, run_tasks

#: per :func:`run_batches` description, the largest peak RSS (bytes) of one of its tasks
#: (Linux: the worker's high-water mark is reset when a task starts; elsewhere the
#: worker's lifetime peak); for benchmarks and logs
TASK_PEAK_RSS: dict[str, int] = {}
#: per :func:`run_batches` description, the CPU seconds of its tasks, summed
TASK_CPU_SECONDS: dict[str, float] = {}


def run_each(fn: Callable[[Any], Any], specs: Sequence[Any], desc: str, show: bool,
             unit: str = "unit", startup: StartupWorker | None = None) -> list[Any]:
    """``[fn(s) for s in specs]``, one Ray task each (named after ``fn``), with a
    progress bar; Ray must be initialized. With ``startup``, the tasks its process took
    while Ray started are its, and the rest go to Ray in its order (largest first)."""
    order = startup.order if startup is not None else range(len(specs))
    local = set(startup.stop()) if startup is not None else set()
    remote = [i for i in order if i not in local]
    results: dict[int, Any] = {}
    with tqdm(total=len(specs), desc=desc, unit=unit, disable=not show) as bar:
        for k, result in run_tasks([TaskCall(fn, (specs[i],)) for i in remote],
                                   ordered=False, on_done=lambda i, r: bar.update(1)):
            results[remote[k]] = result
        if startup is not None:
            done = startup.results()
            bar.update(len(done))
            results.update(done)
    return [results[i] for i in range(len(specs))]


def timed_call(fn: Callable[[Any], Any], spec: Any) -> tuple[Any, float]:
    """``(fn(spec), CPU seconds it took)`` (``time.process_time``: all the task's threads)."""
    cpu0 = time.process_time()
    out = fn(spec)
    return out, time.process_time() - cpu0


def run_each_timed(fn: Callable[[Any], Any], specs: Sequence[Any], desc: str, show: bool,
                   unit: str = "unit") -> list[tuple[Any, float]]:
    """:func:`run_each`, each result with the CPU seconds of its task
    (:func:`timed_call`)."""
    with tqdm(total=len(specs), desc=desc, unit=unit, disable=not show) as bar:
        return list(run_tasks([TaskCall(timed_call, (fn, s), {"name": fn.__name__})
                               for s in specs], on_done=lambda i, r: bar.update(1)))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (Linux >= 4.0, proc(5))
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """This process's peak RSS in bytes (VmHWM, else ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_batch(fn: Callable[[Any], Any], specs: list[Any]) -> tuple[list[Any], int, float]:
    """``[fn(s) for s in specs]`` in one task, the task's peak RSS (bytes) and its CPU
    seconds."""
    _reset_peak_rss()
    cpu0 = time.process_time()
    out = [fn(s) for s in specs]
    return out, _peak_rss(), time.process_time() - cpu0


def batch_cpu_seconds() -> float:
    """CPU seconds of every :func:`run_batches` task this process has run so far (the
    difference over a call is that call's tasks' CPU time)."""
    return sum(TASK_CPU_SECONDS.values())


def run_batches(fn: Callable[[Any], Any], specs: Sequence[Any], desc: str, progress: bool,
                per_task: int | None = None) -> list[Any]:
    """``[fn(s) for s in specs]`` as Ray tasks, ``per_task`` specs per task (default: about
    four tasks per cluster CPU); results in spec order. Ray must be initialized."""
    if not specs:
        return []
    if per_task is None:
        per_task = max(1, math.ceil(len(specs) / (4 * cluster_cpus())))
    groups = [list(specs[i:i + per_task]) for i in range(0, len(specs), per_task)]
    results: list[Any] = []
    with tqdm(total=len(specs), desc=desc, unit="part", disable=not progress) as bar:
        def done(i: int, res: tuple[list[Any], int, float]) -> None:
            TASK_PEAK_RSS[desc] = max(TASK_PEAK_RSS.get(desc, 0), res[1])
            TASK_CPU_SECONDS[desc] = TASK_CPU_SECONDS.get(desc, 0.0) + res[2]
            bar.update(len(groups[i]))
        for out, _, _ in run_tasks([TaskCall(run_batch, (fn, g)) for g in groups],
                                   on_done=done):
            results += out
    return results
