"""The LEM precompute's chunks as Ray tasks, with their outputs in shared memory.

When every Ray node is this one, the tasks write straight into the output arrays, a file
under /dev/shm that they map (:func:`_shared_outputs`, unlinked once written): nothing
crosses the object store and the driver assembles nothing. On a cluster each task returns
its arrays, narrowed to uint16 where every value fits, through the object store, and the
driver copies them in. Tasks are submitted biggest text first, so that the last to start is
a short one; those still pending when the run ends (an error, an interrupt) are cancelled.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numba as nb
import numpy as np

from tokenmill.ngram.lem_chunks import run_chunk
from tokenmill.raysession import (
    TaskCall,
    on_this_node,
    only_this_node,
    put_shared,
    ray_session,
    run_tasks,
)

_NARROW_NONE = 0xFFFF  # uint16 stand-in for -1 in narrowed next tokens


def _run_chunk_narrow(tokens: np.ndarray, chunk: tuple[int, int, int], params: dict
                      ) -> tuple[int, np.ndarray, np.ndarray]:
    """:func:`~tokenmill.ngram.lem_chunks.run_chunk` for a Ray task: the arrays narrowed to
    uint16 where every value fits (next tokens: ids below 65,535, -1 as 65,535), which halves what
    crosses the object store to the driver (20 bytes a position at k = 4, 10 narrowed). In
    position mode with such ids the kernels write uint16 next tokens directly (no int32 copy)."""
    start, lo, hi = chunk
    out = None
    if params["mode"] == "position" and params.get("narrow_ids"):
        out = (np.zeros(hi - lo, np.int32),
               np.full((hi - lo, params["k"]), _NARROW_NONE, np.uint16))
    lo, ml, nt = run_chunk(tokens, chunk, params, out=out)
    if ml.size and int(ml.max()) < 0xFFFF:
        ml = ml.astype(np.uint16)
    if nt.dtype != np.uint16 and nt.size and int(nt.max()) < _NARROW_NONE:
        nt = nt.astype(np.uint16)
    return lo, ml, nt


@nb.njit(cache=True)
def _widen_into(src, dst):
    """``dst[:] = src`` for uint16 ``src`` with 65,535 read as -1 (int32 ``dst``)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            v = src[i, j]
            dst[i, j] = -1 if v == 0xFFFF else v


def ray_precompute(x: np.ndarray, chunks: list, params: dict, workers: int,
                    ray_address: str | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~tokenmill.ngram.precompute.precompute_lem`'s chunks as Ray tasks (one CPU each).
    When every Ray node is this one, the tasks write straight into the output arrays, a file
    under /dev/shm that they map (:func:`_shared_outputs`): nothing crosses the object store and
    the driver assembles nothing. Otherwise each task returns its arrays (uint16 where they fit)
    and the driver copies them in."""

    n, k = int(x.size), params["k"]
    with ray_session(ray_address, workers):
        shared = _shared_outputs(n, k) if only_this_node() else None
        if shared is not None:
            path, flat = shared
            try:
                for _ in _ray_chunks(x, chunks, params, _run_chunk_shared, (path, n),
                                     this_node=True):
                    pass
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # the driver's mapping stays valid
            return np.asarray(flat[:n]), np.asarray(flat[n:]).reshape(n, k)
        params["narrow_ids"] = bool(n) and int(x.max()) < _NARROW_NONE
        # the chunks cover [0, n) exactly once, so every row is written below: no prefill
        match_len = np.empty(n, np.int32)
        next_tokens = np.empty((n, k), np.int32)
        for lo, ml, nt in _ray_chunks(x, chunks, params, _run_chunk_narrow, ()):
            match_len[lo:lo + ml.size] = ml  # uint16 lengths widen as they are
            if nt.dtype == np.uint16:
                _widen_into(nt, next_tokens[lo:lo + ml.size])
            else:
                next_tokens[lo:lo + ml.size] = nt
        return match_len, next_tokens


def _shared_outputs(n: int, k: int) -> tuple[str, np.ndarray] | None:
    """The stream's output arrays as one zero-filled file under /dev/shm that this node's
    Ray workers map: ``(path, int32[n * (k + 1)])``, the n match lengths then the
    ``n * k`` next tokens. None when there is nothing to write, no /dev/shm, or less than
    twice the file's size free there (checked once: a tmpfs that fills later fails the
    tasks, it does not fall back). The name holds the driver's pid, so a file left by a
    killed driver is removed by the next call (:func:`_remove_orphans`)."""
    import shutil
    import tempfile

    size = 4 * n * (k + 1)
    if not n or not os.path.isdir(_SHM):
        return None
    _remove_orphans()
    if shutil.disk_usage(_SHM).free < 2 * size:
        return None
    fd, path = tempfile.mkstemp(prefix=f"{_SHM_PREFIX}{os.getpid()}-", dir=_SHM)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return path, np.memmap(path, np.int32, "r+", shape=(n * (k + 1),))


def _remove_orphans() -> None:
    """Remove the shared output files (:func:`_shared_outputs`) of drivers no longer
    running (a SIGKILLed driver cannot remove its own)."""
    for f in Path(_SHM).glob(f"{_SHM_PREFIX}*"):
        pid = f.name[len(_SHM_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                f.unlink()


_SHM_PREFIX = "tokenmill-lem-"
_SHM = "/dev/shm"


def _run_chunk_shared(tokens: np.ndarray, chunk: tuple[int, int, int], params: dict,
                      path: str, n: int) -> int:
    """:func:`~tokenmill.ngram.lem_chunks.run_chunk` for a Ray task on the driver's machine: the
    chunk's rows written into the shared output file (:func:`_shared_outputs`); returns the
    chunk's start. The rows are reset first, so a retried task writes the same bytes."""
    k = params["k"]
    flat = np.memmap(path, np.int32, "r+", shape=(n * (k + 1),))
    _, lo, hi = chunk
    lens, nexts = flat[:n][lo:hi], flat[n:].reshape(n, k)[lo:hi]
    lens[:] = 0
    nexts[:] = -1
    run_chunk(tokens, chunk, params, out=(lens, nexts))
    return lo


def _ray_chunks(x: np.ndarray, chunks: list, params: dict, fn, extra: tuple,
                this_node: bool = False):
    """Run ``fn(x, chunk, params, *extra)`` for every chunk as Ray tasks
    (:func:`tokenmill.raysession.run_tasks`, one CPU each, in the caller's Ray session;
    ``this_node``: pinned to the driver's node), yielding results as they finish. The stream
    is put in the object store once; workers read it zero-copy. The tasks still pending when
    this ends (an error, an interrupt) are cancelled."""
    options = {"num_cpus": 1, **(on_this_node() if this_node else {})}
    ref = put_shared(x)
    # largest (most history) first, so the last task to start is a short one
    order = sorted(chunks, key=lambda c: -(c[2] - c[0]))
    calls = [TaskCall(fn, (ref, c, params, *extra), options) for c in order]
    results = run_tasks(calls, ordered=False)
    with contextlib.closing(results):  # cancels the pending tasks when this generator closes
        for _, result in results:
            yield result
