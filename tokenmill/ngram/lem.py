"""Online causal longest-exact-match (LEM) predictor over a training token stream.

For every position ``i`` of the stream it returns

* ``match_len[i]``: the length of the longest suffix of ``tokens[..i]`` (inclusive) that
  occurred earlier in the stream, and
* ``next_tokens[i, r]``: the token that followed the ``r``-th most recent earlier
  occurrence of that suffix (``r = 0`` most recent; ``-1`` when it occurred fewer than
  ``r + 1`` times, or ``match_len == 0``). It is the side model's guess for
  ``tokens[i + 1]``, the idea of modded-nanogpt's longest-exact-match records.

Exact, not hashed: it is a suffix automaton (Blumer et al., 1985, "The smallest automaton
recognizing the subwords of a text"; online construction as in Crochemore & Hancart)
built online over the stream. When token ``i`` is appended, the suffix link of the new
state is the longest suffix of ``tokens[..i]`` that occurred before ``i``; each state
keeps the ``k`` most recent end positions of its strings, pushed while walking the
suffix-link path of the new state (cost proportional to that path, i.e. to the match
length, amortised O(1) for the automaton itself). Hot loops are numba.

Causality (``mode``):

* ``"position"``: an earlier occurrence ends at ``j < i``; its follower ``tokens[j + 1]``
  is at most position ``i``. Nothing at or after ``i + 1`` is used.
* ``"step"``: as modded-nanogpt PR #367, matches come only from earlier training steps,
  so a whole step is answered at once: an occurrence ends before the current step's first
  position ``P`` (``j <= P - 1``); the follower is at most position ``P <= i``. The
  automaton is extended with the previous step's tokens, then the current step's
  positions are matched against it (a suffix-automaton traversal).

Document boundaries: the stream's documents are separated by the EOT token (every
document starts with it, as in tokenmill's shards); a match may contain EOT only as its
first token, so it never crosses a document boundary. The stream's first token is a
boundary too. Batches ``(B, T)`` are read row-major as one contiguous stream (rows that
are not contiguous windows of the data should start with EOT, as modded-nanogpt's
BOS-aligned loader does).

Memory window and eviction: with ``window = W`` and ``H = W // 2``, the automaton is
rebuilt whenever the insert position ``p`` reaches a multiple of ``H``, from the ``H``
tokens before it. So after inserting position ``p`` the visible history is
``[S, p]`` with ``S = max(0, (p // H - 1) * H)``: between ``H`` and ``W`` tokens, and an
earlier occurrence must lie entirely inside it (``p = i`` in position mode, ``p = P - 1``
in step mode). Memory: a transition hash table of ``2**ceil(log2(4 W))`` 16-byte slots
allocated up front (3 W edges at most, load <= 3/4; 256 MB for the default W = 4 M),
plus states of ``16 + 4 k`` bytes (one interleaved row each) grown on demand up to
``2 W`` (real text needs ~ 1.3 per token: ~ 170 MB at W = 4 M, k = 4), plus the token
history (4 B per token).
``window=0`` never evicts (memory then grows with the stream). Each token is inserted at
most twice (live and in one rebuild).

Cost: amortised O(1) automaton work per token plus the suffix-link path pushed for the
``k`` most recent occurrences, which is short in natural text (~ 4 states) but grows in
highly repetitive text (a stretch repeated r times in the window makes it ~ r). Measured
figures: ``benchmarks/bench_ngram.py``.
"""

from __future__ import annotations

from typing import Literal

import numba as nb
import numpy as np

_MUL = np.uint64(0x9E3779B97F4A7C15)

# meta slots
_NSTATES, _LAST, _NEDGES, _S, _NEXT, _HBASE, _HLEN, _DOC, _BITS = range(9)


# --------------------------------------------------------------------------- automaton


@nb.njit(cache=True, inline="always")
def _slot(key, bits):
    return np.int64((np.uint64(key) * _MUL) >> np.uint64(64 - bits))


@nb.njit(cache=True, inline="always")
def _probe(hkeys, bits, state, tok):
    """Slot of transition (state, tok): where its key is, or the empty slot it would use
    (linear probing)."""
    key = (np.int64(state) << 32) | np.int64(tok)
    mask = (np.int64(1) << bits) - 1
    s = _slot(key, bits)
    while True:
        k = hkeys[s]
        if k == key or k == -1:
            return s
        s = (s + 1) & mask


@nb.njit(cache=True)
def _get(hkeys, hval, bits, state, tok):
    s = _probe(hkeys, bits, state, tok)
    return hval[s] if hkeys[s] != -1 else -1


@nb.njit(cache=True, inline="always")
def _put(hkeys, hval, hnext, head, meta, s, state, tok, target):
    """Fill slot s (from _probe) with (state, tok) -> target."""
    if hkeys[s] == -1:
        hkeys[s] = (np.int64(state) << 32) | np.int64(tok)
        hnext[s] = head[state]
        head[state] = s
        meta[_NEDGES] += 1
    hval[s] = target


@nb.njit(cache=True)
def _set(hkeys, hval, hnext, head, meta, state, tok, target):
    """Insert or overwrite the transition (state, tok) -> target."""
    s = _probe(hkeys, meta[_BITS], state, tok)
    _put(hkeys, hval, hnext, head, meta, s, state, tok, target)


@nb.njit(cache=True)
def _reset(slen, link, head, recent, hkeys, meta):
    hkeys[:] = -1
    slen[0] = 0
    link[0] = -1
    head[0] = -1
    recent[0, :] = -1
    meta[_NSTATES] = 1
    meta[_LAST] = 0
    meta[_NEDGES] = 0


@nb.njit(cache=True)
def _extend(slen, link, head, recent, hkeys, hval, hnext, meta, c, pos):
    """Append token c at global position pos; returns the state of the longest suffix of
    the text that occurred before pos (its length is slen[link[cur]]), or 0 (root)."""
    bits = meta[_BITS]
    last = meta[_LAST]
    cur = meta[_NSTATES]
    meta[_NSTATES] += 1
    slen[cur] = slen[last] + 1
    head[cur] = -1
    for r in range(recent.shape[1]):
        recent[cur, r] = -1
    p = last
    q = -1
    while p != -1:
        s = _probe(hkeys, bits, p, c)
        if hkeys[s] != -1:
            q = hval[s]
            break
        _put(hkeys, hval, hnext, head, meta, s, p, c, cur)
        p = link[p]
    if p == -1:
        link[cur] = 0
    else:
        if slen[p] + 1 == slen[q]:
            link[cur] = q
        else:
            clone = meta[_NSTATES]
            meta[_NSTATES] += 1
            slen[clone] = slen[p] + 1
            head[clone] = -1
            e = head[q]
            while e != -1:
                _set(hkeys, hval, hnext, head, meta, clone, hkeys[e] & 0xFFFFFFFF, hval[e])
                e = hnext[e]
            link[clone] = link[q]
            for r in range(recent.shape[1]):
                recent[clone, r] = recent[q, r]
            while p != -1:
                s = _probe(hkeys, bits, p, c)
                if hkeys[s] == -1 or hval[s] != q:
                    break
                hval[s] = clone
                p = link[p]
            link[q] = clone
            link[cur] = clone
    meta[_LAST] = cur
    return link[cur]


@nb.njit(cache=True)
def _push_recent(link, recent, v, pos):
    """Push pos as the most recent end position of v and all its suffix-link ancestors."""
    k = recent.shape[1]
    while v > 0:
        for r in range(k - 1, 0, -1):
            recent[v, r] = recent[v, r - 1]
        recent[v, 0] = pos
        v = link[v]


@nb.njit(cache=True)
def _answer(slen, link, recent, hist, hbase, v, L, out_len, out_next, o):
    """Write match length L of state v (walking up to the state holding length L)."""
    k = recent.shape[1]
    if L <= 0:
        out_len[o] = 0
        for r in range(k):
            out_next[o, r] = -1
        return
    while slen[link[v]] >= L:
        v = link[v]
    out_len[o] = L
    for r in range(k):
        j = recent[v, r]
        out_next[o, r] = -1 if j < 0 else hist[j + 1 - hbase]


@nb.njit(cache=True)
def _insert(slen, link, head, recent, hkeys, hval, hnext, meta, hist, half, eot, pos):
    """Insert hist token at global position pos, rebuilding first at window boundaries.
    Returns the answer state (the link of the new state) before recents are pushed."""
    if half > 0 and pos > 0 and pos % half == 0:
        start = pos - half
        _reset(slen, link, head, recent, hkeys, meta)
        for j in range(start, pos):
            v = _extend(slen, link, head, recent, hkeys, hval, hnext, meta,
                        hist[j - meta[_HBASE]], j)
            _push_recent(link, recent, v, j)
            recent[meta[_LAST], 0] = j
        meta[_S] = start
    v = _extend(slen, link, head, recent, hkeys, hval, hnext, meta, hist[pos - meta[_HBASE]],
                pos)
    return v


@nb.njit(cache=True)
def _run_position(slen, link, head, recent, hkeys, hval, hnext, meta, hist, half, eot,
                  out_len, out_next):
    """Per-position mode over the hist tokens [meta[_NEXT], hbase + hlen)."""
    end = meta[_HBASE] + meta[_HLEN]
    o = 0
    for pos in range(meta[_NEXT], end):
        c = hist[pos - meta[_HBASE]]
        if c == eot:
            meta[_DOC] = pos
        v = _insert(slen, link, head, recent, hkeys, hval, hnext, meta, hist, half, eot, pos)
        L = slen[v]
        cap = pos - meta[_DOC] + 1
        if L > cap:
            L = cap
        _answer(slen, link, recent, hist, meta[_HBASE], v, L, out_len, out_next, o)
        _push_recent(link, recent, v, pos)
        recent[meta[_LAST], 0] = pos
        o += 1
    meta[_NEXT] = end


@nb.njit(cache=True)
def _run_step(slen, link, head, recent, hkeys, hval, hnext, meta, hist, half, eot,
              step_start, out_len, out_next):
    """Per-step mode: insert hist tokens [meta[_NEXT], step_start) (the earlier steps),
    then match positions [step_start, hbase + hlen) against the automaton."""
    for pos in range(meta[_NEXT], step_start):
        if hist[pos - meta[_HBASE]] == eot:
            meta[_DOC] = pos
        v = _insert(slen, link, head, recent, hkeys, hval, hnext, meta, hist, half, eot, pos)
        _push_recent(link, recent, v, pos)
        recent[meta[_LAST], 0] = pos
    meta[_NEXT] = step_start
    bits = meta[_BITS]
    # traversal state for position step_start - 1: the whole text, capped at its document
    v = meta[_LAST]
    L = slen[v]
    if step_start > 0:
        cap = step_start - 1 - meta[_DOC] + 1
        if L > cap:
            L = cap
        while v > 0 and slen[link[v]] >= L:
            v = link[v]
    hbase = meta[_HBASE]
    end = hbase + meta[_HLEN]
    o = 0
    for pos in range(step_start, end):
        c = hist[pos - hbase]
        if c == eot:  # a match may hold EOT only as its first token
            v, L = 0, 0
        while True:
            t = _get(hkeys, hval, bits, v, c)
            if t != -1:
                v = t
                L += 1
                break
            if v == 0:
                L = 0
                break
            v = link[v]
            L = slen[v]
        _answer(slen, link, recent, hist, hbase, v, L, out_len, out_next, o)
        o += 1


@nb.njit(cache=True)
def _compact(hist, meta, keep_from):
    """Drop history before global position keep_from."""
    shift = keep_from - meta[_HBASE]
    if shift <= 0:
        return
    n = meta[_HLEN] - shift
    hist[:n] = hist[shift:shift + n]
    meta[_HBASE] = keep_from
    meta[_HLEN] = n


def _bits_for(n_tokens: int) -> int:
    """Hash table bits for the <= 3 n edges of n tokens at load <= 3/4."""
    return max(16, int(np.ceil(np.log2(4 * n_tokens + 16))))


class OnlineLEM:
    """Online causal longest-exact-match predictor (see the module docstring).

    Args:
        eot: the EOT/BOS token id that starts every document.
        k: next tokens per position (most recent occurrences first).
        mode: ``"position"`` (per-position causality) or ``"step"`` (per training step).
        window: visible history bound ``W`` in tokens (``0``: unbounded); eviction rule in
            the module docstring. Storage grows on demand up to what ``W`` needs.

    Raises:
        ValueError: bad ``mode``/``k``/``window``, or a token id outside ``[0, 2**31)``.
    """

    def __init__(self, eot: int, k: int = 4, mode: Literal["position", "step"] = "step",
                 window: int = 4_000_000):
        if mode not in ("position", "step"):
            raise ValueError(f"mode must be 'position' or 'step', not {mode!r}")
        if k < 1:
            raise ValueError(f"k must be >= 1, not {k}")
        if window < 0 or window == 1:
            raise ValueError(f"window must be 0 (unbounded) or >= 2, not {window}")
        self.eot, self.k, self.mode, self.window = int(eot), int(k), mode, int(window)
        self.half = window // 2
        self.meta = np.zeros(9, np.int64)
        self.meta[_DOC] = 0
        self._st = np.zeros((0, 4 + self.k), np.int32)
        self._grow_states(1 << 16)
        # windowed: the transition table is allocated once at its bound (3 W edges at load
        # <= 3/4), as rehashing while the automaton grows costs more than it saves
        self._grow_table(_bits_for(window) if window else 16)
        _reset(self._slen, self._link, self._head, self._recent, self._hkeys, self.meta)
        self.hist = np.zeros(1 << 16, np.int32)

    # -- storage: grown on demand (by doubling), never beyond what the window needs
    def _grow_states(self, cap: int) -> None:
        # interleaved rows (len, link, head, pad, recent[0..k)): one state is one cache
        # line or less, for the automaton walk and the recent-occurrence pushes alike
        n = self._st.shape[0]
        st = np.zeros((cap, 4 + self.k), np.int32)
        st[:n] = self._st
        st[n:, 2] = -1
        st[n:, 4:] = -1
        self._st = st
        self._slen, self._link, self._head = st[:, 0], st[:, 1], st[:, 2]
        self._recent = st[:, 4:]

    def _grow_table(self, bits: int) -> None:
        # interleaved: a slot's (key int64, target int32, next edge int32) share 16 bytes
        buf = np.zeros((1 << bits) * 16, np.uint8)
        hkeys = np.ndarray((1 << bits,), np.int64, buf, 0, (16,))
        hval = np.ndarray((1 << bits,), np.int32, buf, 8, (16,))
        hnext = np.ndarray((1 << bits,), np.int32, buf, 12, (16,))
        hkeys[:] = -1
        old = getattr(self, "_hkeys", None)
        self.meta[_BITS] = bits
        if old is not None:  # re-insert every edge; the per-state edge lists are rebuilt
            self._head[: int(self.meta[_NSTATES])] = -1
            self.meta[_NEDGES] = 0
            _rehash(old, self._hval, hkeys, hval, hnext, self._head, self.meta)
        self._buf, self._hkeys, self._hval, self._hnext = buf, hkeys, hval, hnext

    def _reserve(self, n_new: int) -> None:
        """Room for inserting n_new more tokens: <= 2 states and <= 3 edges per token (a
        suffix automaton's bounds), the table kept at load <= 3/4; capped by the window."""
        m = self.meta
        states = int(m[_NSTATES]) + 2 * n_new + 4
        edges = int(m[_NEDGES]) + 3 * n_new + 16
        if self.window:
            states = min(states, 2 * self.window + 4)
            edges = min(edges, 3 * self.window + 16)
        if states > self._st.shape[0]:
            self._grow_states(max(states, 2 * self._st.shape[0]))
        if edges > 3 * (1 << int(m[_BITS])) // 4:  # unbounded mode only: grow x4
            self._grow_table(max(_bits_for(edges // 3), int(m[_BITS]) + 2))

    @property
    def arrays(self) -> tuple:
        return (self._slen, self._link, self._head, self._recent, self._hkeys, self._hval,
                self._hnext)

    def _append(self, toks: np.ndarray) -> None:
        m = self.meta
        if self.half:  # keep the history the next rebuild needs: [next - H - (next % H)...]
            keep = max(0, (int(m[_NEXT]) // self.half - 1) * self.half)
            _compact(self.hist, m, keep)
        need = int(m[_HLEN]) + toks.size
        if need > self.hist.size:
            h = np.zeros(max(need, 2 * self.hist.size), np.int32)
            h[: m[_HLEN]] = self.hist[: m[_HLEN]]
            self.hist = h
        self.hist[m[_HLEN]:need] = toks
        m[_HLEN] = need
        self._reserve(int(m[_HBASE] + m[_HLEN] - m[_NEXT]))

    @property
    def position(self) -> int:
        """Tokens consumed so far (global position of the next token)."""
        return int(self.meta[_HBASE] + self.meta[_HLEN])

    def step(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Consume the next training step's tokens and return their predictions.

        Args:
            batch: int array of any shape (``(B, T)`` typically), read row-major as the
                continuation of the stream.

        Returns:
            ``(match_len int32[*batch.shape], next_tokens int32[*batch.shape, k])``.
        """
        a = np.asarray(batch)
        flat = np.ascontiguousarray(a.reshape(-1), dtype=np.int32)
        if a.size and (int(a.min()) < 0 or int(a.max()) >= 2**31 - 1):
            bad = a.reshape(-1)[(a.reshape(-1) < 0) | (a.reshape(-1) >= 2**31 - 1)][0]
            raise ValueError(f"token id {int(bad)} at stream position >= {self.position} "
                             "is outside [0, 2**31 - 1)")
        start = self.position
        self._append(flat)
        out_len = np.empty(flat.size, np.int32)
        out_next = np.empty((flat.size, self.k), np.int32)
        slen, link, head, recent, hkeys, hval, hnext = self.arrays
        if self.mode == "position":
            _run_position(slen, link, head, recent, hkeys, hval, hnext, self.meta, self.hist,
                          self.half, self.eot, out_len, out_next)
        else:
            _run_step(slen, link, head, recent, hkeys, hval, hnext, self.meta, self.hist,
                      self.half, self.eot, start, out_len, out_next)
        return out_len.reshape(a.shape), out_next.reshape(*a.shape, self.k)


@nb.njit(cache=True)
def _rehash(o_hkeys, o_hval, hkeys, hval, hnext, head, meta):
    for s in range(o_hkeys.size):
        key = o_hkeys[s]
        if key != -1:
            _set(hkeys, hval, hnext, head, meta, np.int32(key >> 32), key & 0xFFFFFFFF,
                 o_hval[s])


# --------------------------------------------------------------------------- oracle


@nb.njit(cache=True)
def lem_oracle(tokens, eot, k, step, half):
    """Brute-force reference for :class:`OnlineLEM` (tests only).

    ``step = 0``: per-position mode; ``step = T > 0``: per-step mode with steps of ``T``
    tokens. ``half = window // 2`` (0: unbounded). For every position ``i`` it scans every
    allowed earlier end position ``j`` holding the same token (the others have a common
    suffix of 0) and compares backwards token by token: quadratic in the worst case, no
    index. Returns ``(match_len int32[n], next_tokens int32[n, k])``.
    """
    n = tokens.size
    order = np.argsort(tokens, kind="mergesort")  # positions grouped by token, ascending
    rank = np.empty(n, np.int64)  # index of position i in order
    for r in range(n):
        rank[order[r]] = r
    out_len = np.zeros(n, np.int32)
    out_next = np.full((n, k), -1, np.int32)
    doc = 0
    for i in range(n):
        ti = tokens[i]
        if ti == eot:
            doc = i
        p_last = i if step == 0 else (i // step) * step - 1
        jmax = i - 1 if step == 0 else p_last
        S = 0
        if half > 0 and p_last >= 0:
            S = max(0, (p_last // half - 1) * half)
        capq = i - doc + 1
        best = 0
        r = rank[i] - 1
        while r >= 0 and tokens[order[r]] == ti and order[r] >= S:
            j = order[r]
            r -= 1
            if j > jmax:
                continue
            limit = min(capq, j - S + 1)
            L = 0
            while L < limit and tokens[i - L] == tokens[j - L]:
                L += 1
            if L > best:
                best = L
        out_len[i] = best
        if best > 0:
            got = 0
            r = rank[i] - 1
            while r >= 0 and tokens[order[r]] == ti and order[r] >= S and got < k:
                j = order[r]
                r -= 1
                if j > jmax:
                    continue
                limit = min(capq, j - S + 1)
                L = 0
                while L < limit and tokens[i - L] == tokens[j - L]:
                    L += 1
                if L >= best:
                    out_next[i, got] = tokens[j + 1]
                    got += 1
    return out_len, out_next
