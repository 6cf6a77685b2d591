"""``LEMStream``: the online LEM predictor running beside a trainer, in its own process.

The producer process reads the same batches as the trainer, in training order, runs
:class:`tokenmill.ngram.lem.OnlineLEM` on them and writes each step's
``(match_len int32[B, T], next_tokens int32[B, T, k])`` into a ring of ``ahead`` slots in
shared memory (``multiprocessing.shared_memory``). Two semaphores bound it: the producer
waits for a free slot, so it is never more than ``ahead`` steps ahead of the trainer; the
trainer waits for a filled one.

Trainer side::

    stream = LEMStream(lambda s: loader_batch(s), shape=(B, T), eot=50256, n_steps=N)
    for step in range(N):
        match_len, next_tokens = stream.get(step)  # numpy views into shared memory
        ml = torch.from_numpy(match_len)            # no copy either
        ...
    stream.close()  # or ``with LEMStream(...) as stream:``

The arrays returned by ``get(s)`` stay valid until the next ``get`` (the slot is released
then); copy them to keep them longer. Steps must be read in order 0, 1, 2, ...

Batches: ``batches`` is either a callable ``batches(step) -> int array (B, T)`` or an
iterable of such arrays in training order. With the default ``fork`` start method any
callable or iterable works (the child inherits it); with ``spawn`` it must be picklable.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Callable, Iterable
from multiprocessing import shared_memory

import numpy as np

from tokenmill.ngram.lem import OnlineLEM

# counters (float64 in shared memory)
_PRODUCED, _CONSUMED, _TOKENS, _BUSY_S, _BLOCKED_S, _WAIT_S, _DONE = range(7)


def _views(buf, ahead: int, shape: tuple[int, int], k: int):
    n = shape[0] * shape[1]
    lens = np.ndarray((ahead, *shape), dtype=np.int32, buffer=buf, offset=0)
    nxt = np.ndarray((ahead, *shape, k), dtype=np.int32, buffer=buf, offset=ahead * n * 4)
    return lens, nxt


def _producer(shm_name, cnt_name, ahead, shape, k, batches, n_steps, lem_kwargs, free,
              filled, errors):
    shm = shared_memory.SharedMemory(name=shm_name)
    cshm = shared_memory.SharedMemory(name=cnt_name)
    try:
        counters = np.ndarray((8,), dtype=np.float64, buffer=cshm.buf)
        lens, nxt = _views(shm.buf, ahead, shape, k)
        lem = OnlineLEM(k=k, **lem_kwargs)
        it = None if callable(batches) else iter(batches)
        step = 0
        while n_steps is None or step < n_steps:
            if it is None:
                batch = batches(step)
            else:
                try:
                    batch = next(it)
                except StopIteration:
                    break
            batch = np.asarray(batch)
            if batch.shape != tuple(shape):
                raise ValueError(f"step {step}: batch shape {batch.shape} != {tuple(shape)}")
            t0 = time.perf_counter()
            free.acquire()
            t1 = time.perf_counter()
            ml, nt = lem.step(batch)
            slot = step % ahead
            lens[slot] = ml
            nxt[slot] = nt
            t2 = time.perf_counter()
            counters[_BLOCKED_S] += t1 - t0
            counters[_BUSY_S] += t2 - t1
            counters[_TOKENS] += batch.size
            counters[_PRODUCED] = step + 1
            filled.release()
            step += 1
        del lens, nxt, counters
    except BaseException:
        errors.put(traceback.format_exc())
    finally:
        try:
            np.ndarray((8,), dtype=np.float64, buffer=cshm.buf)[_DONE] = 1
        except Exception:
            pass
        filled.release()  # wake a waiting consumer
        for m in (shm, cshm):
            try:
                m.close()
            except BufferError:  # a view still alive in this frame; the OS frees it
                pass


class LEMStream:
    """Run :class:`~tokenmill.ngram.lem.OnlineLEM` in a separate process, ahead of a trainer.

    Args:
        batches: ``callable(step) -> int array (B, T)`` or an iterable of ``(B, T)``
            arrays, in training order (the trainer's loader order).
        shape: ``(B, T)`` of every batch.
        eot: EOT/BOS token id (document separator).
        k: next tokens per position.
        n_steps: steps to produce (required for a callable; an iterable may just end).
        ahead: ring slots, i.e. how many steps the producer may run ahead of the trainer.
        mode, window, max_len: passed to :class:`OnlineLEM` (``mode="step"`` by default, as
            a trainer querying a whole step at once needs).
        start_method: ``"fork"`` (default) or ``"spawn"``.

    Raises:
        ValueError: bad ``shape``/``ahead``, or a callable without ``n_steps``.
        RuntimeError (from :meth:`get`): the producer process failed (its traceback is in
            the message) or ended before the requested step.
    """

    def __init__(self, batches: Callable[[int], np.ndarray] | Iterable[np.ndarray],
                 shape: tuple[int, int], eot: int, k: int = 4, n_steps: int | None = None,
                 ahead: int = 4, mode: str = "step", window: int = 4_000_000,
                 max_len: int = 0, start_method: str = "fork"):
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"shape must be (B, T) with B, T >= 1, not {shape}")
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, not {ahead}")
        if callable(batches) and n_steps is None:
            raise ValueError("n_steps is required when batches is a callable")
        self.shape, self.k, self.ahead, self.n_steps = tuple(shape), k, ahead, n_steps
        n = shape[0] * shape[1]
        size = ahead * n * 4 * (1 + k)
        self._shm = shared_memory.SharedMemory(create=True, size=size)
        self._cshm = shared_memory.SharedMemory(create=True, size=8 * 8)
        self._counters = np.ndarray((8,), dtype=np.float64, buffer=self._cshm.buf)
        self._counters[:] = 0
        self._lens, self._next = _views(self._shm.buf, ahead, self.shape, k)
        ctx = mp.get_context(start_method)
        self._free = ctx.Semaphore(ahead)
        self._filled = ctx.Semaphore(0)
        self._errors = ctx.Queue()
        self._expect = 0
        self._holding = False
        self._t_start = time.perf_counter()
        self._proc = ctx.Process(
            target=_producer, daemon=True, name="tokenmill-lemstream",
            args=(self._shm.name, self._cshm.name, ahead, self.shape, k, batches, n_steps,
                  {"eot": eot, "mode": mode, "window": window, "max_len": max_len},
                  self._free, self._filled, self._errors))
        self._proc.start()

    def get(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Block until ``step`` is ready; return ``(match_len int32[B, T], next_tokens
        int32[B, T, k])`` as views into the ring (valid until the next ``get``).

        Raises:
            ValueError: steps not read in order.
            RuntimeError: the producer failed or ran out of batches before ``step``.
        """
        if step != self._expect:
            raise ValueError(f"LEMStream steps must be read in order: expected "
                             f"{self._expect}, got {step}")
        if self._holding:  # release the slot of the previous step
            self._free.release()
            self._holding = False
        t0 = time.perf_counter()
        while not self._filled.acquire(timeout=0.05):
            if not self._proc.is_alive() and self._counters[_PRODUCED] <= step:
                self._raise(step)
        if self._counters[_PRODUCED] <= step:  # woken by the producer's exit
            self._raise(step)
        self._counters[_WAIT_S] += time.perf_counter() - t0
        self._counters[_CONSUMED] = step + 1
        self._holding = True
        self._expect += 1
        slot = step % self.ahead
        return self._lens[slot], self._next[slot]

    def _raise(self, step: int):
        err = None
        try:
            err = self._errors.get(timeout=1.0)
        except Exception:
            pass
        if err:
            raise RuntimeError(f"LEMStream producer failed before step {step}:\n{err}")
        raise RuntimeError(f"LEMStream producer ended after "
                           f"{int(self._counters[_PRODUCED])} steps; step {step} requested")

    def __iter__(self):
        step = 0
        while self.n_steps is None or step < self.n_steps:
            try:
                yield self.get(step)
            except RuntimeError:
                if self.n_steps is None and self._counters[_DONE] and self._errors.empty():
                    return
                raise
            step += 1

    @property
    def counters(self) -> dict[str, float]:
        """``produced``/``consumed`` steps, ``lag`` (produced - consumed, <= ``ahead``),
        ``tokens`` produced, ``tokens_per_s`` (producer busy time), ``producer_blocked_s``
        (waiting for a free slot), ``consumer_wait_s`` (trainer waiting for a slot)."""
        c = self._counters
        return {
            "produced": int(c[_PRODUCED]), "consumed": int(c[_CONSUMED]),
            "lag": int(c[_PRODUCED] - c[_CONSUMED]), "tokens": int(c[_TOKENS]),
            "tokens_per_s": float(c[_TOKENS] / c[_BUSY_S]) if c[_BUSY_S] > 0 else 0.0,
            "producer_blocked_s": float(c[_BLOCKED_S]),
            "consumer_wait_s": float(c[_WAIT_S]),
        }

    def close(self) -> None:
        """Stop the producer and free the shared memory (views become invalid)."""
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join(timeout=5)
        self._lens = self._next = self._counters = None
        for shm in (self._shm, self._cshm):
            try:
                shm.close()
                shm.unlink()
            except (FileNotFoundError, BufferError):
                pass

    def __enter__(self) -> LEMStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
