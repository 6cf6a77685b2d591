"""The LEM chunk algorithm: exact causal LEM features of one chunk of a stream.

:func:`precompute_lem` returns, for every position of a stream known in advance, exactly
what :class:`tokenmill.ngram.lem.OnlineLEM` returns when it is fed the same stream (same
``k``, ``window``, ``max_len``, ``eot`` and causality): ``match_len[i]`` (the longest
suffix of ``tokens[..i]`` that occurred earlier in the visible history, capped at the
document start and at ``max_len``) and ``next_tokens[i, r]`` (the token that followed the
``r``-th most recent earlier occurrence of that suffix, ``-1`` when fewer). See
:mod:`tokenmill.ngram.lem` for the semantics (window eviction, EOT handling).

Position mode (the one that matters ahead of time) without an automaton: the longest
previous factor / matching statistics family of methods (Crochemore & Ilie 2008, "Computing
Longest Previous Factor in linear time and applications"), run on the reversed text so that
"suffix ending at i" becomes "prefix starting at n - 1 - i":

1. the window's text ``tokens[S:end]`` is reversed and written as bytes in a prefix-free
   code (the ``256 - m`` most frequent ids one byte, the rest two: 1.4 bytes per gpt2
   token against 2 for big-endian uint16;
   :func:`tokenmill.suffixarray.byte_code`), sorted by ``pydivsufsort``
   (libdivsufsort), and the suffixes that start inside a token dropped: a suffix array of
   the text with relabelled ids, which leaves every LCP, and so every answer, unchanged;
2. the LCP array by the Φ algorithm (Kärkkäinen, Manzini & Puglisi 2009, "Permuted
   longest-common-prefix array"), which has fewer dependent cache misses than Kasai et al.
   (2001);
3. a stack pass each way over the suffix array finds, for every position, the nearest
   suffix-array neighbours that are earlier in the stream (previous / next greater value of
   the reversed position) and their LCP: the longest previous factor ``M``; the match
   length is ``min(M, document cap, max_len)``;
4. the occurrences of that suffix are the LCP interval of depth ``L`` around the position
   (bounds from monotonic stacks over the LCP array, binary searched). A query whose
   interval has at most :data:`SCAN_MAX` ranks (three in four on gpt2 text) is answered
   by scanning it: the ``k`` earliest reversed positions after the query's, next to the
   query's rank in memory;
5. the other intervals are laminar, so they form a tree (a few per thousand tokens: its
   table stays in cache); one sweep in stream order answers each remaining position from
   its interval's ring of the ``k`` most recent followers, then pushes the position's
   follower into the rings of the intervals that hold it (about 2.6 per token), reading
   per-position arrays in order.

Windows and parallelism: with ``window = W`` and ``H = W // 2``, every position of the
chunk ``[c H, (c + 1) H)`` sees the history ``[max(0, (c - 1) H), i]`` (OnlineLEM's rebuild
rule), so each chunk is computed independently from its own ``<= 2 H`` tokens of text:
in-process for one worker, as Ray tasks otherwise (:mod:`tokenmill.ngram.lem_ray`).
Each token is sorted about twice (once as new text, once as history): chunks of more than ``H`` new
tokens would span two history starts, and their second block would need a previous factor
bounded away from the first block's history (not done). Ray tasks are submitted biggest
text first, so that the last to start is a short one. ``window = 0`` (unbounded): every
chunk's text is the whole prefix.

Candidates: the ring of an interval holds the followers of its occurrences in the order
they were pushed, most recent first, ``-1`` padded: OnlineLEM's order (its states push the
same followers in the same order), so the arrays are equal, ties included; the scan picks
the same occurrences (the most recent ones before the query) in the same order.

Cost (one 4 M-token text of the benchmark stream, 2 M queries, k = 4, CPU seconds on a
2-core VM whose speed drifts by up to 30 %): about 1.0-1.5 s, against 2.3-2.5 s before the
byte code, the Φ LCP, the interval scan and the per-position sweep arrays. A profile
before the fused rank pass and the uint16 LCP text: suffix array 23 %, LCP 17 %, the scan
16 %, intervals 10 %, the sweep 8 %, longest previous factor 6 %, the rest 5 % or less
each. Figures of the
whole stream: ``benchmarks/bench_lem.py``. Memory per chunk: about 60 bytes per text token
(byte code and its token starts while sorting, then suffix array, rank, LCP, interval
bounds; ~250 MB at W = 4 M) plus the outputs. Worst case: without ``max_len`` a run of r
copies of one token nests r intervals, so its pushes cost O(r**2), as in OnlineLEM; with
``max_len`` they share one. A scanned query costs at most :data:`SCAN_MAX` steps.

Step mode (optional in the design): answered by :class:`OnlineLEM` itself, per chunk of
whole steps started ``H``-aligned before the chunk (its rebuilds then fall on the same
positions, so the answers are the same); chunks still run in parallel, at the online speed.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from tokenmill.ngram.lem import OnlineLEM, check_lem_params, is_int
from tokenmill.suffixarray import sa_rank_lcp

SCAN_MAX = 64  # queries whose interval has at most this many ranks are answered by a scan


@nb.njit(cache=True)
def _longest_previous(sa, lcp):
    """For every suffix-array rank: the longest common prefix with any suffix starting
    later in the reversed text (= ending earlier in the stream). The nearest ranks on
    each side with a greater start (stack of decreasing starts) have the longest ones."""
    n = sa.size
    best = np.zeros(n, np.int32)
    sv = np.empty(n + 1, np.int32)
    sh = np.empty(n + 1, np.int32)
    for direction in range(2):
        t = 0
        for i in range(n):
            r = i if direction == 0 else n - 1 - i
            if direction == 0:
                cur = lcp[r] if r > 0 else 0
            else:
                cur = lcp[r + 1] if r + 1 < n else 0
            a = sa[r]
            while t > 0 and sv[t - 1] < a:
                t -= 1
                if t > 0 and sh[t - 1] < cur:
                    cur = sh[t - 1]
            if t > 0:
                if cur > best[r]:
                    best[r] = cur
                sh[t - 1] = cur
            sv[t] = a
            t += 1
    return best


@nb.njit(cache=True)
def _match_lengths(rtext, rank, best, nq, eot, max_len, out_len):
    """Match length of the queries (reversed positions ``p < nq``): the longest previous
    factor ``best[rank[p]]``, capped at the document start (a match holds EOT only as its
    first token: in the reversed text, the first EOT at or after p) and at ``max_len``
    (0: none). Written to ``out_len[nq - 1 - p]`` (stream order) and, in place, to
    ``best`` by rank (0 for the ranks of non-query positions)."""
    m = rtext.size
    e = -1  # first EOT at or after p in the reversed text
    for p in range(m - 1, -1, -1):
        if rtext[p] == eot:
            e = p
        r = rank[p]
        if p < nq:
            cap = (e - p + 1) if e >= 0 else m - p
            L = best[r]
            if L > cap:
                L = cap
            if max_len > 0 and L > max_len:
                L = max_len
            best[r] = L
            out_len[nq - 1 - p] = L
        else:
            best[r] = 0


@nb.njit(cache=True, inline="always")
def _last_below(sval, t, L):
    """Index of the topmost stack entry (values strictly increasing) with value < L."""
    lo, hi = 0, t - 1  # sval[0] is the sentinel -1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if sval[mid] < L:
            lo = mid
        else:
            hi = mid - 1
    return lo


@nb.njit(cache=True)
def _intervals(lcp, lens):
    """LCP interval ``[lo, hi]`` of depth ``lens[r]`` around each query rank (the ranks
    whose suffix shares its first ``lens[r]`` tokens): previous / next LCP value below the
    depth, from monotonic stacks (binary searched). ``lo = hi = -1`` where ``lens`` is 0."""
    n = lcp.size
    lo_out = np.full(n, -1, np.int32)
    hi_out = np.full(n, -1, np.int32)
    sval = np.empty(n + 1, np.int32)
    sidx = np.empty(n + 1, np.int32)
    for direction in range(2):
        sval[0] = -1
        sidx[0] = 0 if direction == 0 else n
        t = 1
        for i in range(n):
            r = i if direction == 0 else n - 1 - i
            x = r if direction == 0 else r + 1  # the LCP entry that joins r to its side
            if 0 < x < n:
                v = lcp[x]
                while sval[t - 1] >= v:
                    t -= 1
                sval[t] = v
                sidx[t] = x
                t += 1
            if lens[r] > 0:
                j = _last_below(sval, t, lens[r])
                if direction == 0:
                    lo_out[r] = sidx[j]
                else:
                    hi_out[r] = sidx[j] - 1
    return lo_out, hi_out


@nb.njit(cache=True)
def _number_intervals(lo, hi, n):
    """Distinct query intervals in (lo ascending, hi descending) order, i.e. pre-order of
    their (laminar) tree: a counting sort on lo, then each lo-bucket by hi. Returns
    ``(node int32[nq] (-1: no interval), ilo int32[nint], ihi int32[nint])``."""
    nq = lo.size
    start = np.zeros(n + 1, np.int32)
    for q in range(nq):
        if lo[q] >= 0:
            start[lo[q] + 1] += 1
    for r in range(n):
        start[r + 1] += start[r]
    total = start[n]
    order = np.empty(total, np.int32)
    fill = start[:n].copy()
    for q in range(nq):
        if lo[q] >= 0:
            order[fill[lo[q]]] = q
            fill[lo[q]] += 1
    for r in range(n):
        a, b = start[r], start[r + 1]
        if b - a > 16:
            idx = np.argsort(-hi[order[a:b]], kind="mergesort")
            order[a:b] = order[a:b][idx]
        else:
            for i in range(a + 1, b):  # insertion sort, hi descending
                q = order[i]
                j = i - 1
                while j >= a and hi[order[j]] < hi[q]:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = q
    node = np.full(nq, -1, np.int32)
    ilo = np.empty(total, np.int32)
    ihi = np.empty(total, np.int32)
    nint = 0
    for i in range(total):
        q = order[i]
        if nint == 0 or ilo[nint - 1] != lo[q] or ihi[nint - 1] != hi[q]:
            ilo[nint] = lo[q]
            ihi[nint] = hi[q]
            nint += 1
        node[q] = nint - 1
    return node, ilo[:nint], ihi[:nint]


@nb.njit(cache=True)
def _scan_small(sa, rtext, lens, lo, hi, nq, k, scan_max, out_next):
    """Answer the queries whose interval has at most ``scan_max`` ranks directly: the
    followers of the k earliest reversed positions after the query's among ``sa[lo..hi]``
    (the k most recent earlier occurrences, most recent first), written to
    ``out_next[nq - 1 - p]``. Those intervals are then dropped (``lo[r] = -1``) from the
    sweep. The scan reads ranks next to r: cache-local in this rank-order pass."""
    n = sa.size
    best = np.empty(k, np.int32)
    for r in range(n):
        if lens[r] <= 0:
            continue
        a, b = lo[r], hi[r]
        if b - a + 1 > scan_max:
            continue
        p = sa[r]
        c = 0
        for x in range(a, b + 1):
            v = sa[x]
            if v > p and (c < k or v < best[k - 1]):
                j = c if c < k else k - 1  # insertion into the sorted best[:c]
                while j > 0 and best[j - 1] > v:
                    best[j] = best[j - 1]
                    j -= 1
                best[j] = v
                if c < k:
                    c += 1
        o = nq - 1 - p
        for j in range(c):
            out_next[o, j] = rtext[best[j] - 1]
        lo[r] = -1


@nb.njit(cache=True)
def _interval_tree(ilo, ihi, node, sa, nq, width):
    """The sweep's tables. ``table[v]``: interval v's parent (the nearest enclosing
    interval, -1 at the top; intervals come in pre-order) then its ring of followers
    (-1), one ``width``-int32 row. By reversed position p (so that the sweep reads them in
    order): ``qnode[p]`` (p < nq) the query's interval, ``push[p]`` the deepest interval
    holding p's rank (-1: none)."""
    nint = ilo.size
    n = node.size
    table = np.full((nint, width), -1, np.int32)
    qnode = np.full(nq, -1, np.int32)
    push = np.full(n, -1, np.int32)
    stack = np.empty(nint + 1, np.int32)
    t = 0
    it = 0
    for r in range(n):
        while t > 0 and ihi[stack[t - 1]] < r:
            t -= 1
        while it < nint and ilo[it] == r:
            table[it, 0] = stack[t - 1] if t > 0 else -1
            stack[t] = it
            t += 1
            it += 1
        p = sa[r]
        if p < nq:
            qnode[p] = node[r]
        if t > 0:
            push[p] = stack[t - 1]
    return table, qnode, push


@nb.njit(cache=True)
def _sweep(rtext, table, qnode, push, nq, k, out_next):
    """Stream-order sweep (reversed positions descending): answer each query from its
    interval's ring of the k most recent followers, then push the position's follower into
    every interval holding it. ``out_next[nq - 1 - p]`` is query p's row."""
    for p in range(rtext.size - 1, -1, -1):
        if p < nq:
            v = qnode[p]
            if v >= 0:
                o = nq - 1 - p
                for j in range(k):
                    out_next[o, j] = table[v, 1 + j]
        if p == 0:
            break
        f = rtext[p - 1]  # the follower (next token in stream order)
        v = push[p]
        while v >= 0:
            for j in range(k, 1, -1):
                table[v, j] = table[v, j - 1]
            table[v, 1] = f
            v = table[v, 0]


# --------------------------------------------------------------------------- one chunk


def lem_chunk_position(text: np.ndarray, n_query: int, *, k: int, eot: int,
                       max_len: int = 0, out: tuple[np.ndarray, np.ndarray] | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Position-mode LEM of the last ``n_query`` positions of ``text``, the whole of which
    is their visible history (an earlier occurrence must lie inside ``text``).

    Args:
        text: int32[m] token ids (>= 0), the history window followed by the query positions.
        n_query: how many trailing positions to answer (``<= m``).
        k, eot, max_len: as :class:`~tokenmill.ngram.lem.OnlineLEM`'s.
        out: ``(int32[n_query] zeros, int32[n_query, k] C-contiguous, all -1)`` to write
            into (views of the whole stream's arrays save a copy); None allocates them.
            The next tokens may be uint16 (all 65,535) when every id is below 65,535:
            -1 is then written as 65,535.

    Returns:
        ``(match_len int32[n_query], next_tokens int32[n_query, k])`` (``out`` if given).

    Raises:
        ValueError: uint16 next tokens in ``out`` for a text with an id >= 65,535.
    """
    m = int(text.size)
    if out is None:
        out = np.zeros(n_query, np.int32), np.full((n_query, k), -1, np.int32)
    lens_out, next_out = out
    if next_out.dtype == np.uint16 and m and int(text.max()) >= 0xFFFF:
        raise ValueError(f"uint16 next tokens cannot hold id {int(text.max())} "
                         "(ids must be below 65,535)")
    if n_query == 0 or m == 0:
        return lens_out, next_out
    rtext = np.ascontiguousarray(text[::-1], dtype=np.int32)
    sa, rank, lcp = sa_rank_lcp(rtext)
    lens = _longest_previous(sa, lcp)  # by rank; the match lengths in place below
    _match_lengths(rtext, rank, lens, n_query, eot, max_len, lens_out)
    del rank
    lo, hi = _intervals(lcp, lens)
    del lcp
    _scan_small(sa, rtext, lens, lo, hi, n_query, k, SCAN_MAX, next_out)
    del lens
    node, ilo, ihi = _number_intervals(lo, hi, m)
    del lo, hi
    width = 4 if k <= 3 else (8 if k <= 7 else k + 1)  # parent + ring, cache-line aligned
    table, qnode, push = _interval_tree(ilo, ihi, node, sa, n_query, width)
    del node, ilo, ihi, sa
    _sweep(rtext, table, qnode, push, n_query, k, next_out)
    return lens_out, next_out


def lem_chunk_step(tokens: np.ndarray, start: int, lo: int, hi: int, *, k: int, eot: int,
                   window: int, max_len: int, step_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Step-mode LEM of positions ``[lo, hi)`` (whole steps) by a fresh
    :class:`~tokenmill.ngram.lem.OnlineLEM` fed from ``start`` (a multiple of ``H``, or 0),
    which then rebuilds at the same positions as one fed from 0: the same answers.

    Returns:
        ``(match_len int32[hi - lo], next_tokens int32[hi - lo, k])``.
    """
    lem = OnlineLEM(eot, k=k, mode="step", window=window, max_len=max_len)
    if lo > start:
        lem.step(tokens[start:lo])  # history only (answers discarded)
    lens, nexts = [], []
    for a in range(lo, hi, step_tokens):
        ml, nt = lem.step(tokens[a:min(a + step_tokens, hi)])
        lens.append(ml)
        nexts.append(nt)
    if not lens:
        return np.zeros(0, np.int32), np.zeros((0, k), np.int32)
    return np.concatenate(lens), np.concatenate(nexts)


# --------------------------------------------------------------------------- chunks


def plan_chunks(n: int, *, window: int, mode: str = "position", step_tokens: int | None = None,
                chunk_tokens: int | None = None) -> list[tuple[int, int, int]]:
    """Independent chunks ``(history_start, lo, hi)`` covering ``[0, n)``.

    Position mode: chunk boundaries at multiples of ``H = window // 2`` (every position of
    ``[c H, (c + 1) H)`` has the history start ``max(0, (c - 1) H)``), subdivided to at most
    ``chunk_tokens``. Step mode: boundaries on whole steps; the history start is that of
    the chunk's first step, ``max(0, ((lo - 1) // H - 1) H)``. ``window = 0``: history
    start 0 (each chunk sorts its whole prefix).
    """
    half = window // 2
    size = chunk_tokens or (half if half else n) or 1
    if half:
        size = min(size, half)
    if mode == "step":
        size = max(step_tokens, size // step_tokens * step_tokens)
    out = []
    lo = 0
    while lo < n:
        hi = min(n, lo + size)
        if mode == "position" and half:
            hi = min(hi, (lo // half + 1) * half)
            start = max(0, (lo // half - 1) * half)
        elif half:
            start = max(0, ((lo - 1) // half - 1) * half) if lo > 0 else 0
        else:
            start = 0
        out.append((start, lo, hi))
        lo = hi
    return out


def run_chunk(tokens: np.ndarray, chunk: tuple[int, int, int], params: dict,
               out: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[int, np.ndarray, np.ndarray]:
    """One chunk ``(history_start, lo, hi)``: ``(lo, match_len, next_tokens)``, written
    into ``out`` (and returned as it) when given, whatever the mode."""
    start, lo, hi = chunk
    if params["mode"] == "position":
        ml, nt = lem_chunk_position(tokens[start:hi], hi - lo, k=params["k"],
                                    eot=params["eot"], max_len=params["max_len"], out=out)
    else:
        ml, nt = lem_chunk_step(tokens, start, lo, hi, k=params["k"], eot=params["eot"],
                                window=params["window"], max_len=params["max_len"],
                                step_tokens=params["step_tokens"])
        if out is not None:  # step mode answers in its own arrays: into ``out`` too
            out[0][:], out[1][:] = ml, nt
            ml, nt = out
    return lo, ml, nt


def check_args(tokens, k, mode, window, step_tokens, eot, max_len) -> np.ndarray:
    """``tokens`` as a contiguous int32 stream once every argument of
    :func:`tokenmill.ngram.precompute.precompute_lem` is checked (its Raises)."""
    check_lem_params(k=k, mode=mode, window=window, eot=eot, max_len=max_len)
    if mode == "step" and (not is_int(step_tokens) or step_tokens < 1):
        raise ValueError(f"mode='step' needs step_tokens >= 1 (tokens per training step), "
                         f"not {step_tokens!r}")
    a = np.asarray(tokens)
    if a.ndim != 1:
        raise ValueError(f"tokens must be a 1-D stream, not shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"tokens must be integer ids, not {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= 2**31 - 1):
        bad = np.nonzero((a < 0) | (a >= 2**31 - 1))[0][0]
        raise ValueError(f"token id {int(a[bad])} at stream position {int(bad)} is outside "
                         "[0, 2**31 - 1)")
    return np.ascontiguousarray(a, dtype=np.int32)


