"""LEM features computed while training by CPU workers (Ray tasks), chunk by chunk ahead.

:class:`LEMWorkers` is the third LEM source of the trainer (config ``lem_workers: N``; a
:class:`tokenmill.train.side.SideInput`), next to the side channel made before the run and
the online predictor's process: the global
training stream (the loader's rows of ``T + 1`` tokens, the stream of ``tokenmill ngram
lem``) is cut into the independent position-mode chunks of
:func:`tokenmill.ngram.lem_chunks.plan_chunks` (each with its own history window), and each
chunk is a Ray task running :func:`tokenmill.ngram.lem_chunks.lem_chunk_position`. The
trainer submits chunks as it reads the stream, keeps ``ahead`` chunks in flight past the
one it needs, and waits (``wait_s``, reported as the LEM wait share) only when a chunk is
not done yet; so training starts after the first (short) chunk, and more workers keep up
with a faster trainer. The features equal ``precompute_lem`` over the stream (hence the
side channel's, before its uint8 saturation), for any number of ranks (each rank computes
the global stream's chunks and reads its rows: ``world`` times the CPU work of one).

Memory: the stream of the run (``steps * Bg * (T + 1)`` int32, read ahead as chunks are
submitted) and the results of the chunks in flight.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import numpy as np
import torch

from tokenmill.ngram.lem_chunks import lem_chunk_position, plan_chunks
from tokenmill.raysession import TaskCall, TaskPool, ray_session
from tokenmill.train.batches import TrainData
from tokenmill.train.config import TrainConfig
from tokenmill.train.lemside import DEFAULT_WINDOW, LEM_NAMES, lem_for_validation
from tokenmill.train.side import rank_rows, rank_span


class LEMWorkers:
    """Position-mode LEM features from Ray tasks that run ahead of the trainer.

    Args:
        data: the run's data; the global stream has ``global_rows`` rows per step.
        cfg: the run (``steps``, ``grad_accum``, ``lem_k``, ``lem_window`` (None: 4 M),
            ``lem_max_len``, ``lem_workers``, ``lem_chunk_tokens`` (None: ``window / 8``)).
        ahead: chunks kept in flight past the one the trainer reads (default ``2 *
            lem_workers``).

    ``get(step)`` returns ``(match_len int32 [B, T], candidates int32 [B, T, k])``.
    """

    key, names = "lem", LEM_NAMES

    @classmethod
    def from_config(cls, data: TrainData, cfg: TrainConfig) -> LEMWorkers | None:
        """The workers when ``lem: true`` and ``lem_workers`` is set."""
        return cls(data, cfg) if cfg.lem and cfg.lem_workers else None

    def __init__(self, data: TrainData, cfg: TrainConfig, ahead: int | None = None) -> None:
        self.data = data
        self.w = data.row_tokens
        n = cfg.steps * cfg.grad_accum * data.global_rows * self.w
        self.window = cfg.lem_window or DEFAULT_WINDOW
        size = cfg.lem_chunk_tokens or max(self.w, self.window // 8)
        self.chunks = plan_chunks(n, window=self.window, chunk_tokens=size)
        self.los = np.array([c[1] for c in self.chunks] + [n], np.int64)
        self.kw = {"k": cfg.lem_k, "eot": int(data.tokenizer.eot_token),
                   "max_len": cfg.lem_max_len}
        self.stream = np.empty(n, np.int32)
        self.read_to = 0
        self.batches = data.global_batches()
        self.ahead = ahead or 2 * cfg.lem_workers
        # Ray up for the feed's life (shut down by close() if this feed started it)
        self._ray = ExitStack()
        self._ray.enter_context(ray_session(None, cfg.lem_workers))
        self.tasks = TaskPool()
        self.handles: dict[int, int] = {}  # chunk index -> its pending task
        self.done: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.next_chunk = 0
        self.wait_s, self.lag_sum, self.lag_n, self.step = 0.0, 0, 0, 0
        self._submit_to(self.ahead)

    def _read_stream(self, hi: int) -> None:
        while self.read_to < hi:
            rows = next(self.batches)
            self.stream[self.read_to:self.read_to + rows.size] = rows.reshape(-1)
            self.read_to += rows.size

    def _submit_to(self, last: int) -> None:
        """Submit every chunk up to index ``last`` (inclusive) not submitted yet."""
        while self.next_chunk <= min(last, len(self.chunks) - 1):
            start, lo, hi = self.chunks[self.next_chunk]
            self._read_stream(hi)
            call = TaskCall(lem_chunk_position, (self.stream[start:hi].copy(), hi - lo),
                            {"num_cpus": 1}, self.kw)
            self.handles[self.next_chunk] = self.tasks.submit(call)
            self.next_chunk += 1

    def _chunk(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        if c not in self.done:
            if c not in self.handles:
                self._submit_to(c)
            self.done[c] = self.tasks.result(self.handles.pop(c))
        return self.done[c]

    def skip_to(self, step: int) -> None:
        """Start at ``step`` after a resume: chunks before it are never computed."""
        c = int(np.searchsorted(self.los, step * self.data.global_rows * self.w,
                                side="right")) - 1
        if c > self.next_chunk:
            for i in list(self.handles):
                self.tasks.cancel(self.handles.pop(i))
            self.next_chunk = c
        self.step = step
        self._submit_to(c + self.ahead)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of the loader's global step ``step``; the call's time
        (reading the stream ahead, submitting, waiting for chunks) adds to ``wait_s``."""
        t0 = time.perf_counter()
        lo, hi = rank_span(self.data, step)
        ca = int(np.searchsorted(self.los, lo, side="right")) - 1
        cb = int(np.searchsorted(self.los, hi - 1, side="right")) - 1
        self._submit_to(cb + self.ahead)
        ml = np.empty(hi - lo, np.int32)
        nt = np.empty((hi - lo, self.kw["k"]), np.int32)
        for c in range(ca, cb + 1):
            cml, cnt = self._chunk(c)
            a, b = max(lo, int(self.los[c])), min(hi, int(self.los[c + 1]))
            ml[a - lo:b - lo] = cml[a - int(self.los[c]):b - int(self.los[c])]
            nt[a - lo:b - lo] = cnt[a - int(self.los[c]):b - int(self.los[c])]
        for c in [c for c in self.done if c < ca]:
            del self.done[c]
        self.step = step + 1
        self.lag_sum += self.lag
        self.lag_n += 1
        out = rank_rows(self.data, ml), rank_rows(self.data, nt)
        self.wait_s += time.perf_counter() - t0
        return out

    def for_validation(self, val: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~tokenmill.train.lemside.lem_for_validation` with the workers' window and
        ``max_len``."""
        return lem_for_validation(self.data, val, k=self.kw["k"], window=self.window,
                                  max_len=self.kw["max_len"])

    @property
    def lag(self) -> int:
        """Steps of the stream submitted (done or in flight) past the trainer's."""
        return int(self.los[self.next_chunk] // (self.data.global_rows * self.w)) - self.step

    @property
    def mean_lag(self) -> float:
        """Mean of :attr:`lag` over the steps read so far."""
        return self.lag_sum / self.lag_n if self.lag_n else float("nan")

    def close(self) -> None:
        """Cancel the tasks in flight; shut Ray down if this feed started it."""
        self.handles.clear()
        self.tasks.close()
        self.done.clear()
        self._ray.close()
