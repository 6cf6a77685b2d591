"""Suffix arrays and LCP arrays of token texts: the one place tokenmill sorts suffixes.

* :func:`integer_suffix_array`: libdivsufsort (``pydivsufsort``) on the token ids as
  integers, so suffixes compare as the id strings: what the n-gram index stores and binary
  searches (:mod:`tokenmill.ngram.index`);
* :func:`suffix_array` and :func:`sa_rank_lcp`: libdivsufsort on a prefix-free byte code of
  the ids (:func:`byte_code`: 1.4 bytes per gpt2 token against 2 for big-endian uint16),
  the suffixes that start inside a token dropped: a suffix array of the text with
  relabelled ids, which leaves every LCP unchanged (what the LEM precompute needs,
  :mod:`tokenmill.ngram.lem_chunks`), with the inverse suffix array and the LCP array by
  the Φ algorithm (Kärkkäinen, Manzini & Puglisi 2009, "Permuted longest-common-prefix
  array"; fewer dependent cache misses than Kasai et al. 2001);
* :func:`capped_lcp`: the LCP of neighbouring suffixes of one part, capped (the n-gram
  counts' runs, :mod:`tokenmill.ngram.counts`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

_CODE_VOCAB = 1 << 22  # ids below this are byte-coded; larger ids take pydivsufsort's path


def integer_suffix_array(part: np.ndarray) -> np.ndarray:
    """Suffix array (int32[n]) of one part's token ids ``part`` (uint16, uint32 or int32,
    the part's sentinel last) by libdivsufsort's integer path, fastest on int32: uint16 ids
    are widened (the uint16 sentinel keeps its order). Releases the GIL while sorting."""
    from pydivsufsort import divsufsort

    return divsufsort(part.astype(np.int32) if part.dtype == np.uint16 else part)


@nb.njit(cache=True)
def _encode(rtext, code, n1):
    """The text as bytes in a prefix-free code: ``code[t] < n1`` is one byte, any other
    ``c`` two (``n1 + (c - n1) // 256``, ``(c - n1) % 256``). Returns ``(bytes uint8[b],
    start int32[b])``: ``start[j]`` is the token that byte j starts, -1 for a second byte."""
    n = rtext.size
    buf = np.empty(2 * n, np.uint8)
    start = np.empty(2 * n, np.int32)
    j = 0
    for i in range(n):
        c = code[rtext[i]]
        if c < n1:
            buf[j] = c
            start[j] = i
            j += 1
        else:
            c -= n1
            buf[j] = n1 + (c >> 8)
            start[j] = i
            buf[j + 1] = c & 255
            start[j + 1] = -1
            j += 2
    return buf[:j], start[:j]


@nb.njit(cache=True)
def _token_suffixes(byte_sa, start, n):
    """The suffix array of the tokens: the byte suffix array's token-start positions."""
    sa = np.empty(n, np.int32)
    j = 0
    for v in byte_sa:
        s = start[v]
        if s >= 0:
            sa[j] = s
            j += 1
    return sa


def byte_code(text: np.ndarray) -> tuple[np.ndarray, int] | None:
    """A prefix-free byte code of ``text``'s tokens for suffix sorting, or ``None`` (ids of
    ``2**22`` or more, or more than 65,281 distinct ids).

    The ``256 - m`` most frequent ids get one byte, the others two bytes whose first is one
    of ``m`` lead bytes (``m`` as small as the distinct ids allow: 1.4 bytes per token on
    gpt2 text against 2 for big-endian uint16). Byte strings of a prefix-free code compare
    as the token strings under a relabelling of the ids, and equal tokens stay equal, so
    the suffix array's token-start suffixes are a suffix array of the text (of the
    relabelled ids: every LCP, and so every LEM answer, is the same).

    Returns:
        ``(code int32[max id + 1], n1)``: ids coded below ``n1`` take one byte.
    """
    mx = int(text.max()) if text.size else 0
    if mx >= _CODE_VOCAB:
        return None
    count = np.bincount(text, minlength=mx + 1)
    distinct = int(np.count_nonzero(count))
    m = max(0, -(-(distinct - 256) // 255))  # lead bytes: (256 - m) + 256 m >= distinct
    if m > 255:
        return None
    code = np.empty(mx + 1, np.int32)
    code[np.argsort(-count, kind="stable")] = np.arange(mx + 1, dtype=np.int32)
    return code, 256 - m


def suffix_array(text: np.ndarray) -> np.ndarray:
    """Suffix array of int32 ``text`` (int32[n]) by libdivsufsort (``pydivsufsort``) on the
    text's :func:`byte_code` bytes, dropping the suffixes that start inside a token; texts
    it cannot code go to ``pydivsufsort.divsufsort`` as integers (it sorts big-endian
    bytes of the ids' width the same way)."""
    sa, start = _divsufsort_coded(text)
    if start is None or sa.size == text.size:
        return sa  # sorted as integers, or one byte per token
    return _token_suffixes(sa, start, text.size)


def _divsufsort_coded(text: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """libdivsufsort on ``text``'s :func:`byte_code` bytes: ``(byte suffix array int32,
    start int32)`` (:func:`_encode`'s token starts); ``(suffix array, None)`` for a text
    the code cannot take, sorted as integers."""
    from pydivsufsort import divsufsort

    coded = byte_code(text)
    if coded is None:
        return np.ascontiguousarray(divsufsort(text), dtype=np.int32), None
    buf, start = _encode(text, *coded)
    return np.ascontiguousarray(divsufsort(buf), dtype=np.int32), start


@nb.njit(cache=True)
def _rank_phi(sa, n, rank, phi):
    """Fill ``rank`` (the inverse suffix array) and ``phi`` (``phi[p]``: the suffix just
    before p in the suffix array, -1 for the first), int32[n] each, from the token suffix
    array ``sa`` (int32[n]; a byte suffix array goes to :func:`_rank_phi_bytes`)."""
    prev = -1
    for r in range(n):
        p = sa[r]
        rank[p] = r
        phi[p] = prev
        prev = p


@nb.njit(cache=True)
def _rank_phi_bytes(byte_sa, start, n, sa, rank, phi):
    """:func:`_token_suffixes` and :func:`_rank_phi` in one pass over the byte suffix
    array: ``sa``, ``rank`` and ``phi`` (int32[n] each) filled."""
    prev = -1
    r = 0
    for v in byte_sa:
        p = start[v]
        if p >= 0:
            sa[r] = p
            rank[p] = r
            phi[p] = prev
            prev = p
            r += 1


@nb.njit(cache=True)
def _lcp_from_phi(text, sa, phi):
    """LCP array (``lcp[r]`` = common prefix of suffixes ``sa[r - 1]`` and ``sa[r]``;
    ``lcp[0] = 0``; int32[n]) by the Φ algorithm (Kärkkäinen, Manzini & Puglisi 2009,
    "Permuted longest-common-prefix array"): the permuted LCP in text order, in place of
    ``phi``, then permuted into rank order (fewer dependent cache misses than Kasai)."""
    n = text.size
    h = 0
    for p in range(n):  # phi becomes the permuted LCP in place
        q = phi[p]
        if q < 0:
            h = 0
            phi[p] = 0
            continue
        while p + h < n and q + h < n and text[p + h] == text[q + h]:
            h += 1
        phi[p] = h
        if h > 0:
            h -= 1
    lcp = np.empty(n, np.int32)
    for r in range(n):
        lcp[r] = phi[sa[r]]
    if n:
        lcp[0] = 0
    return lcp


def rank_lcp(text: np.ndarray, sa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse suffix array and LCP array (int32[n] each) of ``text`` and its suffix
    array ``sa`` (:func:`_lcp_from_phi`)."""
    n = text.size
    rank = np.empty(n, np.int32)
    phi = np.empty(n, np.int32)
    _rank_phi(sa, n, rank, phi)
    return rank, _lcp_from_phi(text, sa, phi)


def sa_rank_lcp(text: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Suffix array, inverse suffix array and LCP array (int32[n] each) of int32
    ``text``: :func:`suffix_array` with its token-start filter fused into the first
    pass of :func:`rank_lcp`. The LCP pass compares a uint16 copy of the text when the
    ids fit (half the memory for its random reads)."""
    n = text.size
    byte_sa, start = _divsufsort_coded(text)
    if start is None:
        rank, lcp = rank_lcp(text, byte_sa)
        return byte_sa, rank, lcp
    rank = np.empty(n, np.int32)
    phi = np.empty(n, np.int32)
    if byte_sa.size == n:  # one byte per token
        sa = byte_sa
        _rank_phi(sa, n, rank, phi)
    else:
        sa = np.empty(n, np.int32)
        _rank_phi_bytes(byte_sa, start, n, sa, rank, phi)
    del byte_sa, start
    narrow = text.astype(np.uint16) if n and int(text.max()) < 65536 else text
    return sa, rank, _lcp_from_phi(narrow, sa, phi)


@nb.njit(cache=True)
def capped_lcp(tokens, sa, s, e, cap):
    """lcp[i - s] = common prefix length (<= cap) of suffixes sa[i - 1] and sa[i] of one
    part (lcp[0] = 0); the part's sentinel is unique, so no prefix runs past it."""
    lcp = np.zeros(e - s, np.uint8)
    for i in range(s + 1, e):
        p = np.int64(sa[i - 1])
        q = np.int64(sa[i])
        k = 0
        while k < cap and tokens[p + k] == tokens[q + k]:
            k += 1
        lcp[i - s] = k
    return lcp
