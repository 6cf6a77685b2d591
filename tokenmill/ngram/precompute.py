"""Causal longest-exact-match (LEM) features of a whole token stream, computed ahead of time.

:func:`precompute_lem` returns, for every position of a stream known in advance, exactly
what :class:`tokenmill.ngram.lem.OnlineLEM` returns when it is fed the same stream (same
``k``, ``window``, ``max_len``, ``eot`` and causality). The stream is cut into independent
chunks (:func:`tokenmill.ngram.lem_chunks.plan_chunks`); each is computed by the chunk
algorithm (:mod:`tokenmill.ngram.lem_chunks`, whose docstring gives the method and its
cost), in this process for one worker, as Ray tasks otherwise
(:mod:`tokenmill.ngram.lem_ray`: on one node into shared memory under /dev/shm, on a
cluster through the object store).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from tokenmill.ngram.lem_chunks import check_args, plan_chunks, run_chunk


def precompute_lem(tokens: np.ndarray, *, k: int = 4,
                   mode: Literal["position", "step"] = "position", window: int = 4_000_000,
                   step_tokens: int | None = None, eot: int = 50256, max_len: int = 0,
                   workers: int = 1, ray_address: str | None = None,
                   chunk_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact causal LEM features of a whole stream, equal position for position to
    ``OnlineLEM(eot, k, mode, window, max_len)`` fed the same stream (in steps of
    ``step_tokens`` tokens in step mode). Method: :mod:`tokenmill.ngram.lem_chunks`.

    Args:
        tokens: int[n] the stream (every document starting with ``eot``).
        k: next tokens per position (most recent earlier occurrence first).
        mode: ``"position"`` (suffix array; the fast path) or ``"step"`` (per-step
            causality with steps of ``step_tokens`` from position 0; OnlineLEM per chunk).
        window: visible history ``W`` (``0``: unbounded), OnlineLEM's eviction rule.
        step_tokens: tokens per training step (``B * T``), step mode only.
        eot: the EOT/BOS token id (gpt2's by default).
        max_len: cap on the match length (``0``: none).
        workers: chunks computed at once; ``> 1`` (or a ``ray_address``) runs them as Ray
            tasks through :func:`tokenmill.raysession.ray_session`.
        ray_address: ``HOST:PORT`` of a Ray cluster to join (default: embedded Ray).
        chunk_tokens: new tokens per chunk (default ``H = window // 2``; smaller chunks
            give more tasks, each still sorting its own history).

    Returns:
        ``(match_len int32[n], next_tokens int32[n, k])``, ``-1`` for missing candidates.
        With Ray workers on one node (and room in /dev/shm) both are views of one shared
        mapping of an unlinked /dev/shm file: it counts against /dev/shm while a view
        lives, a forked child's writes show in the parent, and ``resize`` is refused;
        ``np.array(...)`` copies them when that matters.

    Raises:
        ValueError: bad ``k``/``mode``/``window``/``eot``/``max_len``/``step_tokens``, a
            token id outside ``[0, 2**31 - 1)`` (naming its position), a non 1-D stream.
        TypeError: non-integer tokens.
    """
    x = check_args(tokens, k, mode, window, step_tokens, eot, max_len)
    n = int(x.size)
    params = {"k": int(k), "mode": mode, "window": int(window), "eot": int(eot),
              "max_len": int(max_len), "step_tokens": step_tokens}
    chunks = plan_chunks(n, window=int(window), mode=mode, step_tokens=step_tokens,
                         chunk_tokens=chunk_tokens)
    if workers <= 1 and ray_address is None:
        match_len = np.zeros(n, np.int32)
        next_tokens = np.full((n, int(k)), -1, np.int32)
        for c in chunks:  # each chunk writes straight into the stream's arrays
            run_chunk(x, c, params, out=(match_len[c[1]:c[2]], next_tokens[c[1]:c[2]]))
        return match_len, next_tokens
    from tokenmill.ngram.lem_ray import ray_precompute

    return ray_precompute(x, chunks, params, workers, ray_address)
