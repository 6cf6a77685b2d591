"""Work done while Ray starts: a process forked from the driver before ``ray.init`` runs
the first tasks itself, so the cores are not idle for the seconds an embedded Ray needs
to start its services and workers (about 4 s of wall and of CPU on two cores).

:class:`StartupWorker` takes tasks from the end of a submission order (the run submits the
largest units first, so the startup worker gets the smallest, and never holds the run
up), one at a time, until :meth:`StartupWorker.stop` is called when Ray is up; the tasks
it has not taken then go to Ray. Its results are the same as a Ray task's (the task
functions are content-addressed, so who ran a task never shows in the output).

The process is forked (it shares the driver's imported modules and costs no start-up of
its own) and ends with the driver: it is killed when the driver dies, even by SIGKILL
(Linux ``PR_SET_PDEATHSIG``), and on leaving the ``with`` block with an error.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when its parent dies (a no-op elsewhere); exit at
    once if the parent ``parent`` is already gone (it died before the request was made)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _portable(e: BaseException) -> BaseException:
    """``e`` as the driver can receive it: with the worker's traceback as a note (shown
    under ``TOKENMILL_DEBUG=1``), or, when it does not survive pickling, a RuntimeError
    with its text."""
    e.add_note("raised in the startup worker:\n" + "".join(traceback.format_exception(e)))
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to pickle or unpickle
        return RuntimeError(f"{type(e).__name__}: {e}")


def _work(fn: Callable[[Any], Any], specs: Sequence[Any], order: Sequence[int],
          taken: Any, closed: Any, conn: Any, parent: int) -> None:
    """The startup worker's loop: the next untaken task from the end of ``order`` while
    the driver has not closed the queue; each result (or the exception) sent on ``conn``."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to answer
    while True:
        with taken.get_lock():
            if closed.value or taken.value >= len(order):
                break
            i = order[len(order) - 1 - taken.value]
            taken.value += 1
        try:
            conn.send((i, fn(specs[i]), None))
        except BaseException as e:  # noqa: BLE001 - handed to the driver, raised there
            conn.send((i, None, _portable(e)))
            break
    conn.close()


class StartupWorker:
    """``with StartupWorker(fn, specs, order):`` a forked process runs ``fn(specs[i])``
    for ``i`` from the end of ``order`` until :meth:`stop`.

    Args:
        fn: a module-level task function (as given to Ray).
        specs: the tasks' arguments.
        order: indices into ``specs`` in the order Ray gets them (the worker takes from
            the end).
        enabled: False: no process, every task goes to Ray (joining a running cluster,
            where Ray is up at once and the driver's node may not hold the data).
    """

    def __init__(self, fn: Callable[[Any], Any], specs: Sequence[Any], order: Sequence[int],
                 enabled: bool = True) -> None:
        self.fn, self.specs, self.order = fn, specs, list(order)
        self.enabled = enabled and len(self.order) > 1
        self._taken: Any = None
        self._closed: Any = None
        self._proc: Any = None
        self._conn: Any = None
        self._stopped: list[int] | None = None
        self._reader: threading.Thread | None = None
        self._results: dict[int, Any] = {}
        self._error: BaseException | None = None

    def __enter__(self) -> StartupWorker:
        if not self.enabled:
            return self
        ctx = multiprocessing.get_context("fork")
        self._taken, self._closed = ctx.Value("i", 0), ctx.Value("b", False)
        self._conn, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_work, daemon=True, name="tokenmill-startup",
                                 args=(self.fn, self.specs, self.order, self._taken,
                                       self._closed, child_end, os.getpid()))
        self._proc.start()
        child_end.close()
        # results are read as they come, so the worker never waits on a full pipe
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        while True:
            try:
                i, result, error = self._conn.recv()
            except (EOFError, OSError):
                return
            except Exception as e:  # noqa: BLE001 - a result that cannot be read
                self._error = self._error or RuntimeError(f"startup worker: {e}")
                return
            if error is not None and self._error is None:
                self._error = error
            elif error is None:
                self._results[i] = result

    def stop(self) -> list[int]:
        """No new task for the worker (Ray is up); returns the indices it took (running
        or done), which Ray must not run."""
        if self._stopped is None:
            self._stopped = []
            if self._proc is not None:
                with self._taken.get_lock():
                    self._closed.value = True
                    n = self._taken.value
                self._stopped = self.order[len(self.order) - n:]
        return self._stopped

    def results(self) -> dict[int, Any]:
        """Wait for the worker's tasks: ``{index: result}``.

        Raises:
            the exception a task raised (the first one; the worker then stops).
        """
        self.stop()
        if self._proc is None:
            return {}
        self._reader.join()
        self._proc.join()
        if self._error is not None:
            raise self._error
        if len(self._results) != len(self._stopped or []):
            raise RuntimeError(f"the startup worker ended with exit code "
                               f"{self._proc.exitcode} before finishing its tasks")
        return dict(self._results)

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()
        self._conn.close()
        self._proc = None
