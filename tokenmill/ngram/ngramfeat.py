"""The n-gram side channel of a token stream, ahead of time: for every position ``p`` the
top-``m`` next-token candidates (a prediction of ``tokens[p + 1]`` given ``tokens[..p]``)
of the interpolated n-gram model of orders 2..8, with natural-log probabilities.

Causality by chunks. The stream is cut into chunks of ``chunk_tokens``; the counts for the
positions of chunk ``c`` come from ``tokens[0 : c * chunk_tokens]`` (the chunks before the
position's chunk) plus an optional ``history`` stream that is always included (the train
stream, for the val split's features). So the counts used at ``p`` never include
``tokens[p + 1]`` or anything after ``p``; positions with no history at all (chunk 0
without ``history``) have no candidates.

Model. The counts and the probability are :class:`tokenmill.ngram.counts.NGramCountsModel`
's (Witten-Bell / Dirichlet-prior interpolation, the one ``tokenmill ngram prob`` uses),
built per chunk over an in-memory :class:`tokenmill.ngram.index.SuffixArrayIndex`
(:meth:`~tokenmill.ngram.index.SuffixArrayIndex.from_tokens`) of the history: ``history``
and the stream prefix are one index part each, so no n-gram spans the two, and the end of
each part is followed by EOT (the index's convention). The top-``m`` are exact
(:func:`exact_topm`): the probabilities are computed term by term as
:meth:`~tokenmill.ngram.counts.NGramCountsModel.topk` computes them, over candidates (each
order's ``K`` most frequent followers, and the most frequent tokens) that grow 4x until a
bound shows that no other token can enter the top ``m`` (the threshold algorithm); sorted
by probability descending, ties by smaller token id. (``topk``'s fixed candidate set can
miss a token: 13 of 200,000 quickstart positions.)

Cost. Chunk ``c`` rebuilds the index and the counts over its whole prefix (about 1 s per
million history tokens on one core: libdivsufsort + one LCP pass), so the build total is
``C (C - 1) / 2`` chunks' worth for ``C`` chunks; :func:`default_chunk_tokens` bounds
``C`` by 16 (chunks grow with the stream), which keeps the build linear in the stream
(at most 8 passes over it). Queries run on numba threads, every position independently,
so the output does not depend on the thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numba as nb
import numpy as np

from tokenmill.ngram.counts import (
    NGramCountsModel,
    _context,
    _follower,
    add_followers,
    check_orders,
)
from tokenmill.ngram.index import SuffixArrayIndex

MAX_CHUNKS = 16
MIN_CHUNK_TOKENS = 1 << 20
QUERY_POSITIONS = 1 << 20


def default_chunk_tokens(n_tokens: int) -> int:
    """``max(ceil(n / 16), min(2**20, ceil(n / 4)))``: at most 16 chunks (each chunk
    rebuilds the counts of the stream before it), chunks of 1 Mi tokens where that gives
    4-16 of them, and always at least 4 chunks, so that a short stream still gets features
    past its first chunk."""
    return max(1, math.ceil(n_tokens / MAX_CHUNKS),
               min(MIN_CHUNK_TOKENS, math.ceil(n_tokens / 4)))


def _as_stream(x, what: str, n_vocab: int) -> np.ndarray:
    """A 1-D int32 copy-free view of a token stream, ids checked against the vocabulary.

    Raises:
        ValueError: not 1-D or an id outside ``[0, n_vocab)`` (naming its position).
        TypeError: non-integer tokens.
    """
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D token stream, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integer token ids, not {a.dtype}")
    if a.size:
        bad = np.flatnonzero((a < 0) | (a >= n_vocab))
        if bad.size:
            raise ValueError(f"{what}: token {int(a[bad[0]])} at position {int(bad[0])} is "
                             f"outside the vocabulary [0, {n_vocab})")
    return a.astype(np.int32, copy=False)


def chunk_model(history: np.ndarray | None, prefix: np.ndarray, *, orders: Sequence[int],
                beta: float, eot: int, n_vocab: int) -> NGramCountsModel | None:
    """The counts model of one chunk's history: ``history`` and ``prefix`` (the stream
    before the chunk) as two parts of an in-memory index; ``None`` when both are empty."""
    parts = [p for p in (history, prefix) if p is not None and p.size]
    if not parts:
        return None
    index = SuffixArrayIndex.from_tokens(parts, eot=eot, n_vocab=n_vocab)
    return NGramCountsModel.build(index, orders, beta=beta)


def query_positions(model: NGramCountsModel, x: np.ndarray, a: int, b: int, m: int,
                    cand: np.ndarray, logp: np.ndarray, max_order: int) -> None:
    """Fill ``cand[a:b]``/``logp[a:b]`` with ``model``'s top-``m`` after each of
    ``x[..p]``, ``a <= p < b`` (contexts reach ``max_order - 1`` tokens back into the
    stream, across the rows of a batch, never across an EOT)."""
    lead = max_order - 1
    for s in range(a, b, QUERY_POSITIONS):
        e = min(b, s + QUERY_POSITIONS)
        lo = max(0, s - lead)
        cand[s:e], logp[s:e] = exact_topm(model, x[lo:e], s - lo, m)


def precompute_ngram(tokens: np.ndarray, *, orders: Sequence[int] = range(2, 9), m: int = 8,
                     chunk_tokens: int | None = None, beta: float = 1.0, eot: int = 50256,
                     n_vocab: int = 50257, history: np.ndarray | None = None,
                     progress: Callable[[str], None] | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Causal n-gram features of a whole stream (module docstring).

    Args:
        tokens: int[N] the stream (MixLoader rows back to back).
        orders: the interpolated n-gram orders (2..32; default 2..8).
        m: candidates per position.
        chunk_tokens: positions of chunk ``c`` use counts of ``tokens[:c * chunk_tokens]``
            (+ ``history``); ``None``: one chunk, i.e. counts of ``history`` only.
        beta: the interpolation prior (``NGramCountsModel``'s ``beta``).
        eot: the EOT id; n_vocab: the vocabulary size.
        history: int[H] a stream whose counts every position uses (val: the train stream).
        progress: called with one line per chunk (``None``: silent).

    Returns:
        ``(cand int32[N, m], logp float32[N, m])``: candidates by probability descending
        (ties: smaller id first), ``-1`` / ``-inf`` where there is none (no history, or a
        vocabulary smaller than ``m``); ``logp`` is the natural log of the probability.

    Raises:
        ValueError: bad ``m``/``chunk_tokens``/``beta``/orders, a
            non 1-D stream or a token outside the vocabulary (naming stream and position).
        TypeError: non-integer tokens.
    """
    orders = check_orders(orders)
    if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 1:
        raise ValueError(f"m must be an integer >= 1, not {m!r}")
    if chunk_tokens is not None and (not isinstance(chunk_tokens, (int, np.integer))
                                     or chunk_tokens < 1):
        raise ValueError(f"chunk_tokens must be an integer >= 1 or None, not {chunk_tokens!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, not {beta!r}")
    x = _as_stream(tokens, "tokens", n_vocab)
    h = None if history is None else _as_stream(history, "history", n_vocab)
    n = int(x.size)
    cand = np.full((n, int(m)), -1, np.int32)
    logp = np.full((n, int(m)), -np.inf, np.float32)
    size = n if chunk_tokens is None else int(chunk_tokens)
    for c, a in enumerate(range(0, n, max(size, 1))):
        b = min(n, a + size)
        t0 = time.perf_counter()
        model = chunk_model(h, x[:a], orders=orders, beta=beta, eot=eot, n_vocab=n_vocab)
        t1 = time.perf_counter()
        if model is not None:
            query_positions(model, x, a, b, int(m), cand, logp, orders[-1])
        if progress is not None:
            progress(f"chunk {c}: positions {a:,}..{b:,}, history "
                     f"{a + (0 if h is None else h.size):,} tokens, build {t1 - t0:.2f} s, "
                     f"queries {time.perf_counter() - t1:.2f} s")
        del model
    return cand, logp


def feature_stats(tokens: np.ndarray, cand: np.ndarray) -> dict[str, float]:
    """Quality of the features against the stream itself: over positions ``p < N - 1``
    that have candidates, ``recall`` (share whose true next token ``tokens[p + 1]`` is among
    the candidates), ``top1`` (share where it is the first) and ``covered`` (share of all
    ``p < N - 1`` that have candidates)."""
    n = int(tokens.size)
    if n < 2:
        return {"recall": 0.0, "top1": 0.0, "covered": 0.0}
    c = cand[:n - 1]
    has = c[:, 0] >= 0
    nxt = np.asarray(tokens[1:], np.int64)[:, None]
    hit = (c == nxt) & has[:, None]
    k = max(int(has.sum()), 1)
    return {"recall": float(hit.any(axis=1).sum() / k), "top1": float(hit[:, 0].sum() / k),
            "covered": float(has.mean())}


# --------------------------------------------------------------------------- exact top-m


@nb.njit(cache=True)
def _candidates(tokens, sa, segs, tots, orders, eot, sentinel, fst, f_tok, uni_order, K, Ku):
    """Sorted distinct candidates: the Ku most frequent tokens, and per order and index
    part the K most frequent followers of the context (all of them when it is not stored)."""
    n_p = segs.shape[1]
    cap = min(Ku, uni_order.size)
    for o in range(orders.size):
        for p in range(n_p):
            ci = segs[o, p, 2]
            cap += min(K, fst[ci + 1] - fst[ci]) if ci >= 0 else segs[o, p, 1] - segs[o, p, 0]
    cand = np.empty(cap, np.int64)
    nc = 0
    for r in range(min(Ku, uni_order.size)):
        cand[nc] = uni_order[r]
        nc += 1
    for o in range(orders.size):
        if tots[o] == 0:
            continue
        for p in range(n_p):
            nc = add_followers(tokens, sa, segs[o, p], orders[o] - 1, fst, f_tok, K, eot,
                               sentinel, cand, nc)
    return np.unique(cand[:nc])


@nb.njit(cache=True)
def _merge_counts(cand, s_tok, s_cnt, lo, hi, cnt):
    """cnt[i] += the count of cand[i] among the followers s_tok[lo:hi] (both sorted by
    token): one merge that gallops over the longer list."""
    j = lo
    for i in range(cand.size):
        x = cand[i]
        if j < hi and s_tok[j] < x:
            g, step = j, 1  # s_tok[g] < x
            while g + step < hi and s_tok[g + step] < x:
                g += step
                step *= 2
            a, b = g + 1, min(g + step, hi)
            while a < b:  # first index in (g, g + step] with s_tok >= x
                mid = (a + b) >> 1
                if s_tok[mid] < x:
                    a = mid + 1
                else:
                    b = mid
            j = a
        if j >= hi:
            return
        if s_tok[j] == x:
            cnt[i] += s_cnt[j]


@nb.njit(cache=True)
def _order_counts(tokens, sa, seg, L, cand, eot, sentinel, fst, s_tok, s_cnt, cnt):
    """cnt[:] = the counts of each candidate after one order's context over every index
    part (what counts.py's ``_count_in`` gives candidate by candidate)."""
    cnt[:] = 0
    for p in range(seg.shape[0]):
        a, b, ci = seg[p, 0], seg[p, 1], seg[p, 2]
        if ci >= 0:
            _merge_counts(cand, s_tok, s_cnt, fst[ci], fst[ci + 1], cnt)
        else:
            for i in range(a, b):
                f = _follower(tokens, sa, i, L, eot, sentinel)
                k = np.searchsorted(cand, f)
                if k < cand.size and cand[k] == f:
                    cnt[k] += 1


@nb.njit(cache=True)
def _outside_bound(segs, tots, orders, unigram, n_uni, beta, fst, f_cnt, uni_order, K, Ku):
    """Upper bound of P(t) for every token t outside :func:`_candidates`' set (P is
    increasing in each count): the recursion applied to the (K+1)-th counts (the
    (Ku+1)-th unigram count); -1 when no token is outside (Ku covers the vocabulary)."""
    V = unigram.size
    if Ku >= V:
        return -1.0
    pb = (unigram[uni_order[Ku]] + 1.0) / (n_uni + V)
    for o in range(orders.size):
        if tots[o] == 0:
            continue
        cb = 0
        for p in range(segs.shape[1]):
            ci = segs[o, p, 2]
            if ci >= 0 and fst[ci] + K < fst[ci + 1]:
                cb += f_cnt[fst[ci] + K]
        pb = (cb + beta * pb) / (tots[o] + beta)
    return pb


@nb.njit(cache=True)
def _topm_one(tokens, sa, parts, row, t, orders, eot, sentinel, unigram, n_uni, beta,
              min_count, keys, ko, fst, s_tok, s_cnt, f_tok, f_cnt, uni_order, m, K0,
              out_ids, out_lp):
    """Exact top-m of ``P(. | row[..t])`` (counts.py's interpolation, evaluated as
    ``NGramCountsModel.topk`` does): the candidates of :func:`_candidates` with ``K``
    followers per order, accepted once the m-th best beats every token outside
    (:func:`_outside_bound`), else ``K`` grows 4x (threshold algorithm, Fagin et al. 2003)."""
    n_ord = orders.size
    segs = np.empty((n_ord, parts.size - 1, 3), np.int64)
    tots = np.empty(n_ord, np.int64)
    seen = True
    for o in range(n_ord):  # a context unseen (or cut) at one order is so at every higher one
        if seen:
            tots[o] = _context(tokens, sa, parts, row, t, orders[o] - 1, eot, min_count, keys,
                               ko, o, segs[o])
            seen = tots[o] > 0
        else:
            tots[o] = 0
            segs[o, :, :2] = 0
            segs[o, :, 2] = -1
    V = unigram.size
    K, Ku = K0, m
    while True:
        cand = _candidates(tokens, sa, segs, tots, orders, eot, sentinel, fst, f_tok,
                           uni_order, K, Ku)
        probs = np.empty(cand.size, np.float64)
        for ci in range(cand.size):
            probs[ci] = (unigram[cand[ci]] + 1.0) / (n_uni + V)
        cnt = np.empty(cand.size, np.int64)
        for o in range(n_ord):
            if tots[o] == 0:
                continue
            _order_counts(tokens, sa, segs[o], orders[o] - 1, cand, eot, sentinel, fst, s_tok,
                          s_cnt, cnt)
            for ci in range(cand.size):
                probs[ci] = (cnt[ci] + beta * probs[ci]) / (tots[o] + beta)
        order = np.argsort(-probs, kind="mergesort")  # ties: smaller token first
        ub = _outside_bound(segs, tots, orders, unigram, n_uni, beta, fst, f_cnt,
                            uni_order, K, Ku)
        if ub < 0 or (cand.size >= m and probs[order[m - 1]] > ub * (1.0 + 1e-12)):
            break
        K, Ku = 4 * K, 4 * Ku
    for r in range(min(m, cand.size)):
        out_ids[r] = cand[order[r]]
        out_lp[r] = np.log(probs[order[r]])


@nb.njit(cache=True, parallel=True)
def _topm_row(tokens, sa, parts, row, first, orders, eot, sentinel, unigram, n_uni, beta,
              min_count, keys, ko, fst, s_tok, s_cnt, f_tok, f_cnt, uni_order, m, K0):
    n = row.size - first
    out_ids = np.full((n, m), -1, np.int32)
    out_lp = np.full((n, m), -np.inf, np.float32)
    for i in nb.prange(n):
        _topm_one(tokens, sa, parts, row, first + i, orders, eot, sentinel, unigram, n_uni,
                  beta, min_count, keys, ko, fst, s_tok, s_cnt, f_tok, f_cnt, uni_order, m,
                  K0, out_ids[i], out_lp[i])
    return out_ids, out_lp


def exact_topm(model: NGramCountsModel, row: np.ndarray, first: int, m: int,
               k0: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``m`` of ``model``'s ``P(next | row[..t])`` for ``first <= t < len(row)``
    (contexts start at ``row[0]``): ``(ids int32[n, m], logp float32[n, m])``, by
    probability descending, ties by smaller id, ``-1``/``-inf`` beyond the vocabulary.
    The probabilities are those ``NGramCountsModel.topk`` computes (the same
    expression, term by term); unlike ``topk`` no token can be missed (threshold test)."""
    t, i = model.t, model.index
    uni_order = np.argsort(-model.unigram, kind="mergesort").astype(np.int64)
    r = np.ascontiguousarray(row, dtype=np.int64)
    return _topm_row(i.tokens, i.sa, i.parts, r, int(first), model.orders, model.eot,
                     i.sentinel, model.unigram, model.n_uni, model.beta, model.min_count,
                     t["keys"], t["ko"], t["fst"], t["s_tok"], t["s_cnt"], t["f_tok"],
                     t["f_cnt"], uni_order, int(m), int(k0 or m))
