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
state is the longest suffix of ``tokens[..i]`` that occurred before ``i``. Each state keeps
the tokens that followed its ``k`` most recent occurrences; an occurrence ending at ``j``
is pushed along the suffix-link path of its state once its follower ``tokens[j + 1]`` is
in the stream (cost proportional to that path, about 4.5 states per token in natural
text). A state is one 64-byte row (length, link, degree, up to 3 out-edges inline and the
followers), so most walk steps cost one cache line; the out-edges of states with more than
3 go to an open-addressing table (Knuth's multiplicative hashing). Hot loops are numba.

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
in step mode). Memory: a transition table of ``2**ceil(log2(4 W))`` 16-byte slots
(256 MB address space for the default W = 4 M; zero-filled lazily, and only the edges of
states with more than 3 go there, about 1 per token), plus 64-byte states (``k <= 6``)
grown on demand up to ``2 W`` (real text needs ~ 1.35 per token: ~ 350 MB at W = 4 M),
plus the token history (4 B per token).
``window=0`` never evicts (memory then grows with the stream). Each token is inserted at
most twice (live and in one rebuild).

Cost: amortised O(1) automaton work per token (measured on 2 M gpt2 tokens of the
benchmark stream: 2.7 suffix-link walk steps, 0.35 clones, 1.35 states, 2.1 edges) plus
the suffix-link path pushed for the ``k`` most recent occurrences, which is short in
natural text (~ 4.5 states) but grows in
highly repetitive text: a stretch repeated r times in the window makes it ~ r, and a run of
r copies of one token (or of a short period) makes it ~ r for every token of the run, so
the run costs O(r**2) (measured: a 40,000-token run of one token takes ~ 3 s). Curated
shards rarely hold such runs (the Gopher repetition filter drops those documents). With
``max_len`` set, only states holding a string of length <= max_len are pushed to or
answered from; per-state shortcut pointers skip the longer ones, so a run costs
O(r * max_len) (the same 40,000-token run: 0.02 s with max_len = 64, 0.16 s with 1024;
the trainer uses 1024). Measured
figures: ``benchmarks/bench_ngram.py``.
"""

from __future__ import annotations

from typing import Literal

import numba as nb
import numpy as np

_MUL = np.uint64(0x9E3779B97F4A7C15)

# meta slots
(_NSTATES, _LAST, _NEDGES, _S, _NEXT, _HBASE, _HLEN, _DOC, _BITS, _PENDING,
 _MAXLEN) = range(11)
_NMETA = 11

# state row columns (int32): string length, suffix link, head of the hashed-edge list,
# out-degree, shortcut to the first ancestor reaching below max_len, then _INLINE (token,
# target) edge pairs, then the k recent followers
_LEN, _LINK, _HEAD, _DEG, _SC = range(5)
_INLINE = 3
_E0 = 5
_R0 = _E0 + 2 * _INLINE


# --------------------------------------------------------------------------- automaton


@nb.njit(cache=True, inline="always")
def _slot(key, bits):
    return np.int64((np.uint64(key) * _MUL) >> np.uint64(64 - bits))


@nb.njit(cache=True, inline="always")
def _hkey(state, tok):
    # + 1: a zero key marks an empty slot, so a fresh table is np.zeros (pages mapped
    # lazily) and a reset clears only the slots in use
    return ((np.int64(state) << 32) | np.int64(tok)) + 1


@nb.njit(cache=True, inline="always")
def _hslot(hkeys, bits, state, tok):
    """Slot of hashed edge (state, tok), or of the empty slot it would take."""
    key = _hkey(state, tok)
    mask = (np.int64(1) << bits) - 1
    s = _slot(key, bits)
    while True:
        k = hkeys[s]
        if k == key or k == 0:
            return s
        s = (s + 1) & mask


@nb.njit(cache=True, inline="always")
def _find(st, hkeys, hval, bits, v, c):
    """Target of edge (v, c), or -1. Low-degree states hold their edges in their own row
    (one cache line with the length and link already read); the others in the table."""
    d = st[v, _DEG]
    if d <= _INLINE:
        for e in range(d):
            if st[v, _E0 + 2 * e] == c:
                return st[v, _E0 + 2 * e + 1]
        return -1
    s = _hslot(hkeys, bits, v, c)
    return hval[s] if hkeys[s] != 0 else -1


@nb.njit(cache=True, inline="always")
def _hput(st, hkeys, hval, hnext, bits, v, c, target):
    """Add the absent edge (v, c) -> target to the table and to v's hashed-edge list."""
    s = _hslot(hkeys, bits, v, c)
    hkeys[s] = _hkey(v, c)
    hval[s] = target
    hnext[s] = st[v, _HEAD]
    st[v, _HEAD] = s


@nb.njit(cache=True)
def _add_edge(st, hkeys, hval, hnext, meta, v, c, target):
    """Add the absent edge (v, c) -> target; the (_INLINE + 1)-th edge moves the row's
    edges to the table."""
    bits = meta[_BITS]
    d = st[v, _DEG]
    if d < _INLINE:
        st[v, _E0 + 2 * d] = c
        st[v, _E0 + 2 * d + 1] = target
    else:
        if d == _INLINE:
            st[v, _HEAD] = -1
            for e in range(_INLINE):
                _hput(st, hkeys, hval, hnext, bits, v, st[v, _E0 + 2 * e],
                      st[v, _E0 + 2 * e + 1])
        _hput(st, hkeys, hval, hnext, bits, v, c, target)
    st[v, _DEG] = d + 1
    meta[_NEDGES] += 1


@nb.njit(cache=True, inline="always")
def _redirect(st, hkeys, hval, bits, v, c, old, new):
    """If edge (v, c) leads to old, point it to new and return True."""
    d = st[v, _DEG]
    if d <= _INLINE:
        for e in range(d):
            if st[v, _E0 + 2 * e] == c:
                if st[v, _E0 + 2 * e + 1] != old:
                    return False
                st[v, _E0 + 2 * e + 1] = new
                return True
        return False
    s = _hslot(hkeys, bits, v, c)
    if hkeys[s] == 0 or hval[s] != old:
        return False
    hval[s] = new
    return True


@nb.njit(cache=True, inline="always")
def _new_state(st, meta, length, link):
    v = meta[_NSTATES]
    meta[_NSTATES] += 1
    st[v, _LEN] = length
    st[v, _LINK] = link
    st[v, _HEAD] = -1
    st[v, _DEG] = 0
    for r in range(_R0, st.shape[1]):
        st[v, r] = -1
    return v


@nb.njit(cache=True, inline="always")
def _set_sc(st, meta, v):
    """Shortcut of v: v itself when its strings reach below max_len (its link is shorter
    than max_len; every ancestor of such a state is one too), else its link's shortcut."""
    u = st[v, _LINK]
    if u < 0 or st[u, _LEN] < meta[_MAXLEN]:
        st[v, _SC] = v
    else:
        st[v, _SC] = st[u, _SC]


@nb.njit(cache=True, inline="always")
def _shallow(st, meta, v):
    """First ancestor-or-self of v whose strings reach below max_len. Shortcuts skip the
    states that only hold longer strings (a long run makes ~ run-length of them); a
    shortcut may land on a state a later split made deeper, whose own shortcut goes on."""
    while True:
        u = st[v, _LINK]
        if u < 0 or st[u, _LEN] < meta[_MAXLEN]:
            return v
        w = st[v, _SC]
        v = w if w != v else u  # (a stale self-shortcut would loop: fall back to the link)


@nb.njit(cache=True, inline="always")
def _holder(st, meta, v, L):
    """The state of v's suffix-link path that holds the string of length L (<= len(v),
    <= max_len)."""
    v = _shallow(st, meta, v)
    while st[st[v, _LINK], _LEN] >= L:
        v = st[v, _LINK]
    return v


@nb.njit(cache=True)
def _reset(st, hkeys, hnext, meta):
    """Empty automaton: clear the table slots in use (walking the hashed-edge lists)."""
    for v in range(meta[_NSTATES]):
        if st[v, _DEG] > _INLINE:
            s = st[v, _HEAD]
            while s != -1:
                hkeys[s] = 0
                s = hnext[s]
    meta[_NSTATES] = 0
    _new_state(st, meta, 0, -1)
    st[0, _SC] = 0
    meta[_LAST] = 0
    meta[_NEDGES] = 0
    meta[_PENDING] = -1


@nb.njit(cache=True)
def _extend(st, hkeys, hval, hnext, meta, c):
    """Append token c (online construction of Blumer et al.); returns the state of the
    longest suffix of the text that occurred before (its length is st[link[cur], 0]), or
    0 (root)."""
    bits = meta[_BITS]
    last = meta[_LAST]
    cur = _new_state(st, meta, st[last, _LEN] + 1, 0)
    p = last
    q = -1
    while p != -1:
        q = _find(st, hkeys, hval, bits, p, c)
        if q != -1:
            break
        _add_edge(st, hkeys, hval, hnext, meta, p, c, cur)
        p = st[p, _LINK]
    if p != -1:
        if st[p, _LEN] + 1 == st[q, _LEN]:
            st[cur, _LINK] = q
        else:
            clone = _new_state(st, meta, st[p, _LEN] + 1, st[q, _LINK])
            _set_sc(st, meta, clone)
            d = st[q, _DEG]
            if d <= _INLINE:
                for e in range(_E0, _E0 + 2 * d):
                    st[clone, e] = st[q, e]
                st[clone, _DEG] = d
                meta[_NEDGES] += d
            else:
                s = st[q, _HEAD]
                while s != -1:
                    _add_edge(st, hkeys, hval, hnext, meta, clone,
                              np.int32((hkeys[s] - 1) & 0xFFFFFFFF), hval[s])
                    s = hnext[s]
            for r in range(_R0, st.shape[1]):
                st[clone, r] = st[q, r]
            while p != -1 and _redirect(st, hkeys, hval, bits, p, c, q, clone):
                p = st[p, _LINK]
            st[q, _LINK] = clone
            _set_sc(st, meta, q)  # q's link got longer: q may now only hold long strings
            st[cur, _LINK] = clone
    _set_sc(st, meta, cur)
    meta[_LAST] = cur
    return st[cur, _LINK]


@nb.njit(cache=True)
def _push(st, meta, v, follower):
    """Record a new most recent occurrence, followed by token ``follower``, for v and all
    its suffix-link ancestors (the states whose end positions gain this one) that hold a
    string of length <= max_len: the others are never answered from."""
    w = st.shape[1]
    v = _shallow(st, meta, v)
    while v > 0:
        for r in range(w - 1, _R0, -1):
            st[v, r] = st[v, r - 1]
        st[v, _R0] = follower
        v = st[v, _LINK]


@nb.njit(cache=True)
def _answer(st, meta, k, v, L, out_len, out_next, o):
    """Write match length min(L, max_len) of state v (from the state holding it)."""
    if L > meta[_MAXLEN]:
        L = meta[_MAXLEN]
    if L <= 0:
        out_len[o] = 0
        for r in range(k):
            out_next[o, r] = -1
        return
    v = _holder(st, meta, v, L)
    out_len[o] = L
    for r in range(k):
        out_next[o, r] = st[v, _R0 + r]


@nb.njit(cache=True)
def _insert(st, hkeys, hval, hnext, meta, hist, half, pos):
    """Insert hist token at global position pos, rebuilding first at window boundaries
    (from the H tokens before pos, each pushed with its follower). Returns the answer
    state (the link of the new state)."""
    hb = meta[_HBASE]
    if half > 0 and pos > 0 and pos % half == 0:
        start = pos - half
        _reset(st, hkeys, hnext, meta)
        for j in range(start, pos):
            _extend(st, hkeys, hval, hnext, meta, hist[j - hb])
            _push(st, meta, meta[_LAST], hist[j + 1 - hb])
        meta[_S] = start
    return _extend(st, hkeys, hval, hnext, meta, hist[pos - hb])


@nb.njit(cache=True)
def _run_position(st, hkeys, hval, hnext, meta, hist, half, eot, k, out_len, out_next):
    """Per-position mode over the hist tokens [meta[_NEXT], hbase + hlen). Position i's
    occurrence is pushed when token i + 1 (its follower) is inserted."""
    hb = meta[_HBASE]
    end = hb + meta[_HLEN]
    o = 0
    for pos in range(meta[_NEXT], end):
        c = hist[pos - hb]
        if c == eot:
            meta[_DOC] = pos
        v = _insert(st, hkeys, hval, hnext, meta, hist, half, pos)
        if meta[_PENDING] >= 0:  # (a rebuild pushed pos - 1 itself and cleared it)
            _push(st, meta, meta[_PENDING], c)
        L = st[v, _LEN]
        cap = pos - meta[_DOC] + 1
        if L > cap:
            L = cap
        _answer(st, meta, k, v, L, out_len, out_next, o)
        meta[_PENDING] = meta[_LAST]
        o += 1
    meta[_NEXT] = end


@nb.njit(cache=True)
def _run_step(st, hkeys, hval, hnext, meta, hist, half, eot, k, step_start, out_len,
              out_next):
    """Per-step mode: insert hist tokens [meta[_NEXT], step_start) (the earlier steps,
    each pushed with its follower, known), then match positions [step_start, hbase + hlen)
    against the automaton."""
    hb = meta[_HBASE]
    for pos in range(meta[_NEXT], step_start):
        if hist[pos - hb] == eot:
            meta[_DOC] = pos
        _insert(st, hkeys, hval, hnext, meta, hist, half, pos)
        _push(st, meta, meta[_LAST], hist[pos + 1 - hb])
    meta[_NEXT] = step_start
    bits = meta[_BITS]
    # traversal state for position step_start - 1: the whole text, capped at its document
    v = meta[_LAST]
    L = st[v, _LEN]
    if step_start > 0:
        cap = step_start - 1 - meta[_DOC] + 1
        if L > cap:
            L = cap
        if L > meta[_MAXLEN]:
            L = meta[_MAXLEN]
        v = _holder(st, meta, v, L) if L > 0 else 0
    end = hb + meta[_HLEN]
    o = 0
    for pos in range(step_start, end):
        c = hist[pos - hb]
        if c == eot:  # a match may hold EOT only as its first token
            v, L = 0, 0
        while True:
            t = _find(st, hkeys, hval, bits, v, c)
            if t != -1:
                v = t
                L += 1
                if L > meta[_MAXLEN]:  # keep the suffix of length max_len (one link up)
                    L = meta[_MAXLEN]
                    if st[st[v, _LINK], _LEN] >= L:
                        v = st[v, _LINK]
                break
            if v == 0:
                L = 0
                break
            v = st[v, _LINK]
            L = st[v, _LEN]
        _answer(st, meta, k, v, L, out_len, out_next, o)
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


@nb.njit(cache=True)
def _rehash(o_hkeys, o_hval, st, hkeys, hval, hnext, bits, nstates):
    for v in range(nstates):
        st[v, _HEAD] = -1
    for s in range(o_hkeys.size):
        key = o_hkeys[s]
        if key != 0:
            _hput(st, hkeys, hval, hnext, bits, np.int64((key - 1) >> 32),
                  np.int32((key - 1) & 0xFFFFFFFF), o_hval[s])


def _bits_for(n_tokens: int) -> int:
    """Hash table bits for the <= 3 n edges of n tokens at load <= 3/4."""
    return max(16, int(np.ceil(np.log2(4 * n_tokens + 16))))


def is_int(x: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_lem_params(*, k: object, mode: object, window: object, eot: object,
                     max_len: object) -> None:
    """Check the LEM predictor's settings (as :class:`OnlineLEM` and
    :func:`tokenmill.ngram.precompute.precompute_lem` take them).

    Raises:
        ValueError: naming the first setting out of range and its value.
    """
    if mode not in ("position", "step"):
        raise ValueError(f"mode must be 'position' or 'step', not {mode!r}")
    if not is_int(eot) or not 0 <= eot < 2**31 - 1:
        raise ValueError(f"eot must be a token id in [0, 2**31 - 1), not {eot!r}")
    if not is_int(k) or k < 1:
        raise ValueError(f"k must be an integer >= 1, not {k!r}")
    if not is_int(window) or window < 0 or window == 1 or window > 2**29:
        raise ValueError(f"window must be 0 (unbounded) or an integer in [2, 2**29], "
                         f"not {window!r}")
    if not is_int(max_len) or max_len < 0:
        raise ValueError(f"max_len must be an integer >= 0 (0: no cap), not {max_len!r}")


class OnlineLEM:
    """Online causal longest-exact-match predictor (see the module docstring).

    Args:
        eot: the EOT/BOS token id that starts every document.
        k: next tokens per position (most recent occurrences first).
        mode: ``"position"`` (per-position causality) or ``"step"`` (per training step).
        window: visible history bound ``W`` in tokens (``0``: unbounded); eviction rule in
            the module docstring. Storage grows on demand up to what ``W`` needs.
        max_len: cap on the reported match length (``0``: none). With a cap the answer is
            ``min(L, max_len)`` and the followers of that suffix's most recent occurrences;
            the work per token is then bounded by ``max_len`` even inside long runs of a
            repeated token or stretch (without it such a run of r tokens costs O(r**2)).

    Raises:
        ValueError: bad ``eot``/``mode``/``k``/``window`` (``window`` at most ``2**29``:
            state ids are int32), or a token id outside ``[0, 2**31 - 1)``.
        TypeError: a batch that is not of an integer dtype.
    """

    def __init__(self, eot: int, k: int = 4, mode: Literal["position", "step"] = "step",
                 window: int = 4_000_000, max_len: int = 0):
        check_lem_params(k=k, mode=mode, window=window, eot=eot, max_len=max_len)
        self.eot, self.k, self.mode, self.window = int(eot), int(k), mode, int(window)
        self.half = window // 2
        self.max_len = int(max_len)
        self.meta = np.zeros(_NMETA, np.int64)
        self.meta[_MAXLEN] = self.max_len if self.max_len else 2**31 - 1
        self._st = np.zeros((0, _R0 + self.k), np.int32)
        self._grow_states(1 << 16)
        # windowed: the transition table is allocated once at its bound (3 W edges at load
        # <= 3/4), as rehashing while the automaton grows costs more than it saves; it is
        # np.zeros, so only the pages that hashed edges touch are ever mapped
        self._grow_table(_bits_for(window) if window else 16)
        _reset(self._st, self._hkeys, self._hnext, self.meta)
        self.hist = np.zeros(1 << 16, np.int32)

    # -- storage: grown on demand (by doubling), never beyond what the window needs
    def _grow_states(self, cap: int) -> None:
        # one row per state: (len, link, head, degree, 3 inline edges, k followers), padded
        # to a 64-byte cache line and aligned to one, so a walk step costs one line
        n = self._st.shape[0]
        width = max(16, -(-(_R0 + self.k) // 16) * 16)
        raw = np.zeros(cap * width + 16, np.int32)
        off = (-raw.ctypes.data % 64) // 4
        st = raw[off:off + cap * width].reshape(cap, width)
        st[:n] = self._st[:n] if self._st.shape[1] == width else 0
        self._st = st

    def _grow_table(self, bits: int) -> None:
        # interleaved: a slot's (key int64, target int32, next edge int32) share 16 bytes
        buf = np.zeros((1 << bits) * 16, np.uint8)
        hkeys = np.ndarray((1 << bits,), np.int64, buf, 0, (16,))
        hval = np.ndarray((1 << bits,), np.int32, buf, 8, (16,))
        hnext = np.ndarray((1 << bits,), np.int32, buf, 12, (16,))
        old = getattr(self, "_hkeys", None)
        self.meta[_BITS] = bits
        if old is not None:  # re-insert every hashed edge; their lists are rebuilt
            _rehash(old, self._hval, self._st, hkeys, hval, hnext, bits,
                    int(self.meta[_NSTATES]))
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
        if states >= 2**31 - 1:  # unbounded mode only (the window bound keeps it below)
            raise ValueError(f"window=0: the automaton would need {states:,} states, beyond "
                             "int32 state ids; use a window")
        if states > self._st.shape[0]:
            self._grow_states(min(max(states, 2 * self._st.shape[0]), 2**31 - 2))
        if edges > 3 * (1 << int(m[_BITS])) // 4:  # unbounded mode only: grow x4
            self._grow_table(max(_bits_for(edges // 3), int(m[_BITS]) + 2))

    @property
    def arrays(self) -> tuple:
        return (self._st, self._hkeys, self._hval, self._hnext)

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
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"a batch holds integer token ids, not {a.dtype} (stream position "
                            f"{self.position})")
        flat = np.ascontiguousarray(a.reshape(-1), dtype=np.int32)
        if a.size and (int(a.min()) < 0 or int(a.max()) >= 2**31 - 1):
            bad = a.reshape(-1)[(a.reshape(-1) < 0) | (a.reshape(-1) >= 2**31 - 1)][0]
            raise ValueError(f"token id {int(bad)} at stream position >= {self.position} "
                             "is outside [0, 2**31 - 1)")
        start = self.position
        self._append(flat)
        out_len = np.empty(flat.size, np.int32)
        out_next = np.empty((flat.size, self.k), np.int32)
        if flat.size == 0:  # (a step's followers must be known before it is inserted)
            return out_len.reshape(a.shape), out_next.reshape(*a.shape, self.k)
        if self.mode == "position":
            _run_position(*self.arrays, self.meta, self.hist, self.half, self.eot, self.k,
                          out_len, out_next)
        else:
            _run_step(*self.arrays, self.meta, self.hist, self.half, self.eot, self.k, start,
                      out_len, out_next)
        return out_len.reshape(a.shape), out_next.reshape(*a.shape, self.k)



# --------------------------------------------------------------------------- oracle


@nb.njit(cache=True, inline="always")
def _common_suffix(tokens, i, j, limit, max_len):
    """Length of the common suffix of ``tokens[..i]`` and ``tokens[..j]``, at most ``limit``
    (and ``max_len`` when it is > 0)."""
    if max_len > 0 and limit > max_len:
        limit = max_len
    n = 0
    while n < limit and tokens[i - n] == tokens[j - n]:
        n += 1
    return n


@nb.njit(cache=True)
def lem_oracle(tokens, eot, k, step, half, max_len=0):
    """Brute-force reference for :class:`OnlineLEM` (tests only).

    ``step = 0``: per-position mode; ``step = T > 0``: per-step mode with steps of ``T``
    tokens. ``half = window // 2`` (0: unbounded); ``max_len`` as :class:`OnlineLEM`'s.
    For every position ``i`` it scans every
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
            L = _common_suffix(tokens, i, j, min(capq, j - S + 1), max_len)
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
                L = _common_suffix(tokens, i, j, min(capq, j - S + 1), max_len)
                if L >= best:
                    out_next[i, got] = tokens[j + 1]
                    got += 1
    return out_len, out_next
