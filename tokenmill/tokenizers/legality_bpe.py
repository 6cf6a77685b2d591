"""BPE side of the legality table: numba kernels.

Within one regex piece, tiktoken's ``byte_pair_merge`` repeatedly merges the adjacent pair of
parts whose concatenation has the lowest rank (leftmost on ties). If tokens ``a`` and ``b``
appear adjacent in the encoding of any piece, then ``byte_pair_merge(bytes(a) + bytes(b))`` is
exactly ``[a, b]``: the merges inside each token's span happen in the same order as in
isolation, and the merge across the junction never wins (the bigram criterion of Berglund et
al., "Formalizing BPE Tokenization", 2023, and Vieira et al., "Language Models over Canonical
Byte-Pair Encodings", 2025; GitHub's ``bpe`` crate uses the same check,
``is_valid_token_pair``). When every token's own merge sequence has non-decreasing ranks
(checked here per token; true for every token of GPT-2 and cl100k_base), the check has a
closed form that a whole row can evaluate at once:

* the rightmost part of ``a`` over "time" (rank) is its *right chain*
  ``s_0 (a byte) -> s_1 -> ... -> a``; ``s_i`` is the rightmost part for ranks in
  ``(rank(s_i), rank(s_{i+1}))``;
* the leftmost part of ``b`` is its *left chain* ``p_0 -> ... -> b``, and left chains form a
  tree (parent of ``b`` = left half of its final merge);
* the junction merge ``s_i + p_j = z`` fires (so ``(a, b)`` is impossible inside a piece) iff
  ``rank(s_i) < rank(z) < rank(s_{i+1})`` (a left merge of equal rank wins, being leftmost),
  ``rank(p_j) < rank(z)`` and the next element of ``b``'s left chain has rank ``>= rank(z)``.

So for each row ``a`` and each ``s_i``, every token ``z`` that extends ``s_i`` by a token ``r``
with ``rank(z)`` in the window marks ``r`` and the subtrees of ``r``'s children with rank
``>= rank(z)``: with children sorted by rank, that is one contiguous interval of the tree's
preorder. A row costs its interval marks plus two passes over the vocabulary. Tokens whose
own merges are not monotone are treated conservatively (never BPE-impossible); tokens that
BPE cannot reach from their own bytes (only produced when a whole piece equals them) can never
have a neighbour inside the same piece.
"""

from __future__ import annotations

import numba as nb
import numpy as np

EMPTY = np.int64(-1)


@nb.njit(cache=True)
def _hash64(k: np.int64) -> np.int64:
    x = np.uint64(k)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    return np.int64(x & np.uint64(0x7FFFFFFFFFFFFFFF))


@nb.njit(cache=True)
def build_pair_hash(left: np.ndarray, right: np.ndarray, merged: np.ndarray, V: int):
    """Open-addressing hash ``(left id, right id) -> merged id`` (int64 keys l*V+r)."""
    n = len(left)
    cap = 1
    while cap < 2 * n + 16:
        cap *= 2
    keys = np.full(cap, EMPTY, dtype=np.int64)
    vals = np.zeros(cap, dtype=np.int32)
    mask = cap - 1
    for i in range(n):
        k = np.int64(left[i]) * V + right[i]
        h = _hash64(k) & mask
        while keys[h] != EMPTY and keys[h] != k:
            h = (h + 1) & mask
        if keys[h] == EMPTY or merged[i] < vals[h]:
            keys[h] = k
            vals[h] = merged[i]
    return keys, vals


@nb.njit(cache=True)
def pair_lookup(keys: np.ndarray, vals: np.ndarray, l: int, r: int, V: int) -> int:
    """Rank (= id) of ``bytes(l) + bytes(r)`` if it is a token, else -1."""
    k = np.int64(l) * V + r
    mask = len(keys) - 1
    h = _hash64(k) & mask
    while keys[h] != EMPTY:
        if keys[h] == k:
            return vals[h]
        h = (h + 1) & mask
    return -1


@nb.njit(cache=True)
def _bpe_token(data, start, end, byte_id, keys, vals, V, parts, pranks):
    """Isolated tiktoken byte_pair_merge of data[start:end] on token ids.

    Returns (n_parts, last_left, last_right, monotone)."""
    n = end - start
    for i in range(n):
        parts[i] = byte_id[data[start + i]]
    for i in range(n - 1):
        pranks[i] = pair_lookup(keys, vals, parts[i], parts[i + 1], V)
    last_l = -1
    last_r = -1
    prev = -1
    mono = True
    while n > 1:
        best = -1
        bi = -1
        for i in range(n - 1):
            r = pranks[i]
            if r >= 0 and (best < 0 or r < best):
                best = r
                bi = i
        if bi < 0:
            break
        if best < prev:
            mono = False
        prev = best
        last_l = parts[bi]
        last_r = parts[bi + 1]
        parts[bi] = best
        for i in range(bi + 1, n - 1):
            parts[i] = parts[i + 1]
            pranks[i] = pranks[i + 1]
        n -= 1
        if bi > 0:
            pranks[bi - 1] = pair_lookup(keys, vals, parts[bi - 1], parts[bi], V)
        if bi < n - 1:
            pranks[bi] = pair_lookup(keys, vals, parts[bi], parts[bi + 1], V)
    return n, last_l, last_r, mono


@nb.njit(parallel=True, cache=True)
def token_splits(data, offsets, ids, byte_id, keys, vals, V, maxlen):
    """Final merge ``(left, right)`` of each token's isolated BPE, plus flags.

    Returns ``split_l, split_r`` (int32[V], -1 for single bytes / non-tokens) and ``kind``
    (int8[V]: 0 = not a mergeable token or unreachable, 1 = reachable with monotone merge
    ranks, 2 = reachable but non-monotone).
    """
    n_tok = len(ids)
    split_l = np.full(V, -1, dtype=np.int32)
    split_r = np.full(V, -1, dtype=np.int32)
    kind = np.zeros(V, dtype=np.int8)
    n_chunks = 64
    for c in nb.prange(n_chunks):
        parts = np.empty(maxlen, dtype=np.int32)
        pranks = np.empty(maxlen, dtype=np.int32)
        for j in range(c, n_tok, n_chunks):
            t = ids[j]
            s, e = offsets[j], offsets[j + 1]
            if e - s == 1:
                kind[t] = 1
                continue
            n, ll, rr, mono = _bpe_token(data, s, e, byte_id, keys, vals, V, parts, pranks)
            if n == 1 and parts[0] == t:
                split_l[t] = ll
                split_r[t] = rr
                kind[t] = 1 if mono else 2
    return split_l, split_r, kind


@nb.njit(cache=True)
def left_tree_order(split_l: np.ndarray, kind: np.ndarray):
    """Preorder of the left-chain tree (parent = left half of the final merge), children in id
    order. Returns ``pos`` (preorder index of each id), ``endp`` (end of its subtree),
    ``child_ptr``/``child_ids`` (CSR of children sorted by id)."""
    V = len(split_l)
    cnt = np.zeros(V + 1, dtype=np.int64)
    for t in range(V):
        p = split_l[t]
        if kind[t] > 0 and p >= 0:
            cnt[p + 1] += 1
    for t in range(V):
        cnt[t + 1] += cnt[t]
    child_ptr = cnt.copy()
    fill = cnt[:-1].copy()
    child_ids = np.empty(cnt[V], dtype=np.int32)
    for t in range(V):  # increasing id -> children sorted by id
        p = split_l[t]
        if kind[t] > 0 and p >= 0:
            child_ids[fill[p]] = t
            fill[p] += 1
    pos = np.empty(V, dtype=np.int32)
    endp = np.empty(V, dtype=np.int32)
    stack = np.empty(V + 1, dtype=np.int64)
    it = np.empty(V + 1, dtype=np.int64)
    k = 0
    for root in range(V):
        if kind[root] > 0 and split_l[root] >= 0:
            continue
        sp = 0
        stack[0] = root
        it[0] = child_ptr[root]
        pos[root] = k
        k += 1
        while sp >= 0:
            v = stack[sp]
            if it[sp] < child_ptr[v + 1]:
                c = child_ids[it[sp]]
                it[sp] += 1
                sp += 1
                stack[sp] = c
                it[sp] = child_ptr[c]
                pos[c] = k
                k += 1
            else:
                endp[v] = k
                sp -= 1
    return pos, endp, child_ptr, child_ids


@nb.njit(cache=True)
def _first_ge(arr, lo, hi, x):
    while lo < hi:
        mid = (lo + hi) // 2
        if arr[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@nb.njit(cache=True)
def _row_intervals(a, split_r, kind, ext_ptr, ext_z, ext_r, pos, endp, child_ptr, child_ids,
                   ilo, ihi, big):
    """Preorder intervals ``[ilo[k], ihi[k])`` of the next tokens ``b`` that BPE forbids after
    ``a`` inside one piece (sorted and merged). Returns their number."""
    n_int = 0
    s = a
    hi = big  # rank at which s stops being a's rightmost part
    while s >= 0:
        lo = s if split_r[s] >= 0 else -1  # single bytes exist from the start
        e0 = ext_ptr[s]
        e1 = ext_ptr[s + 1]
        i = _first_ge(ext_z, e0, e1, lo + 1)
        while i < e1 and ext_z[i] < hi:
            z = ext_z[i]
            r = ext_r[i]
            i += 1
            if kind[r] != 1 or (split_r[r] >= 0 and r >= z):
                continue
            if n_int + 2 > len(ilo):
                break
            ilo[n_int] = pos[r]
            ihi[n_int] = pos[r] + 1
            n_int += 1
            c0 = child_ptr[r]
            c1 = child_ptr[r + 1]
            j = _first_ge(child_ids, c0, c1, z)
            if j < c1:
                ilo[n_int] = pos[child_ids[j]]
                ihi[n_int] = endp[r]
                n_int += 1
        hi = s
        s = split_r[s]
    if n_int == 0:
        return 0
    order = np.argsort(ilo[:n_int])
    slo = ilo[:n_int][order]
    shi = ihi[:n_int][order]
    m = 0
    clo = slo[0]
    chi = shi[0]
    for q in range(1, n_int):
        lo2 = slo[q]
        hi2 = shi[q]
        if lo2 <= chi:
            if hi2 > chi:
                chi = hi2
        else:
            ilo[m] = clo
            ihi[m] = chi
            m += 1
            clo = lo2
            chi = hi2
    ilo[m] = clo
    ihi[m] = chi
    return m + 1


@nb.njit(parallel=True, cache=True)
def build_rows(rows, lsig, cross_bits, cand_bits, kind1_bits, split_r, kind, ext_ptr, ext_z,
               ext_r, pos, endp, child_ptr, child_ids, id_at, n_chunks):
    """Bit-packed rows (little bit order, 1 = possible) for the previous tokens ``rows``.

    ``cross_bits[lsig]``: next tokens the regex lets start a new piece after a token of that
    signature; ``cand_bits[lsig]``: next tokens that may share a piece with it (regex) and are
    BPE-reachable; ``kind1_bits``: next tokens with monotone merges (the BPE verdict applies).
    Row = cross | (cand & ~(bpe_forbidden & kind1)).
    """
    n_rows = len(rows)
    row_bytes = cross_bits.shape[1]
    out = np.empty((n_rows, row_bytes), dtype=np.uint8)
    big = np.int64(1) << 40
    for c in nb.prange(n_chunks):
        bad = np.zeros(row_bytes, dtype=np.uint8)
        ilo = np.empty(1 << 16, dtype=np.int64)
        ihi = np.empty(1 << 16, dtype=np.int64)
        for k in range(c, n_rows, n_chunks):
            a = rows[k]
            la = lsig[a]
            ka = kind[a]
            row = out[k]
            cb = cross_bits[la]
            cd = cand_bits[la]
            if ka != 1:
                for j in range(row_bytes):
                    row[j] = cb[j] | cd[j] if ka == 2 else cb[j]
                continue
            n_int = _row_intervals(a, split_r, kind, ext_ptr, ext_z, ext_r, pos, endp,
                                   child_ptr, child_ids, ilo, ihi, big)
            if n_int >= len(ilo) - 2:  # overflow: keep the row conservative (BPE ignored)
                n_int = 0
            for q in range(n_int):
                for p in range(ilo[q], ihi[q]):
                    b = id_at[p]
                    bad[b >> 3] |= np.uint8(1 << (b & 7))
            for j in range(row_bytes):
                row[j] = cb[j] | (cd[j] & ~(bad[j] & kind1_bits[j]))
                bad[j] = 0
    return out


@nb.njit(parallel=True, cache=True)
def popcount_rows(packed: np.ndarray) -> np.ndarray:
    """Number of set bits per row of a uint8 matrix (int64[n_rows])."""
    lut = np.zeros(256, dtype=np.int64)
    for i in range(256):
        x = i
        c = 0
        while x:
            c += x & 1
            x >>= 1
        lut[i] = c
    n = packed.shape[0]
    out = np.zeros(n, dtype=np.int64)
    for i in nb.prange(n):
        s = 0
        row = packed[i]
        for j in range(packed.shape[1]):
            s += lut[row[j]]
        out[i] = s
    return out
