"""Exact shingle sets for the removal check of fuzzy dedup.

A document's shingle set is represented by the sorted unique 64-bit hashes of its
shingles (same shingling as :func:`~tokenmill.pipeline.dedup.minhash.reference.shingles` and the
MinHash kernel: word ``ngram``-grams of ``normalize_for_shingles``, a document shorter
than ``ngram`` words is one shingle of all its words). A shingle's 64-bit hash is the
Karp-Rabin polynomial ``sum_k murmur64a(w_k) * B**(n-1-k) mod 2**64`` over its words'
full 64-bit MurmurHash64A hashes (``B`` = 0x9E3779B97F4A7C15, odd). Two distinct shingles
get equal hashes with probability about 2**-64 (a MurmurHash64A collision of two words,
or a random cancellation of the polynomial), so a pair of documents with ``s`` shingles
each is mis-measured with probability about ``s**2 / 2**64``: the set is collision-free
in practice, and the Jaccard of two such sets is the Jaccard of the shingle sets.
"""

from __future__ import annotations

from collections.abc import Iterable

import numba
import numpy as np

from tokenmill.pipeline.dedup.minhash.kernels import (
    _M64,
    _ONES64,
    _load_u64le,
    _mm_final,
    _murmur64a_long,
    _murmur64a_short,
    _normalize,
    char_tables,
)

#: odd 64-bit multiplier of the 64-bit shingle polynomial (golden ratio)
SHINGLE_BASE64 = 0x9E3779B97F4A7C15
_PAD = bytes(64)


@numba.njit(cache=True, nogil=True)
def _word_hashes64(buf, s, e, tables, scr, bnd, wh):
    """Full 64-bit ``murmur64a`` of every word of ``normalize_for_shingles(buf[s:e])``
    into ``wh`` (uint64); the number of words, or -1 when the scratch is too small."""
    info, rep_off, rep_cp, rep_word, ascii_lut = tables
    nb = _normalize(buf, s, e, info, rep_off, rep_cp, rep_word, ascii_lut, scr, bnd)
    if nb < 0 or nb // 2 > wh.shape[0]:
        return -1
    nw = nb // 2
    for k in range(nw):
        a = bnd[2 * k]
        n = bnd[2 * k + 1] - a
        if n < 8:
            c0 = _load_u64le(scr, a) & (_ONES64 >> np.uint64(64 - 8 * n))
            wh[k] = _mm_final(((np.uint64(n) * _M64) ^ c0) * _M64)
        elif n <= 16:
            wh[k] = _murmur64a_short(_load_u64le(scr, a), _load_u64le(scr, a + 8), n)
        else:
            wh[k] = _murmur64a_long(scr, a, n)
    return nw


@numba.njit(cache=True, nogil=True)
def _shingle_sets_kernel(buf, doc_off, ngram, tables, base):
    """Sorted unique uint64 shingle hashes of every document of ``buf`` (UTF-8, documents
    at ``doc_off``): ``(values, offsets)``, document d's set is
    ``values[offsets[d]:offsets[d + 1]]``."""
    n_docs = doc_off.shape[0] - 1
    longest = 1
    for d in range(n_docs):
        longest = max(longest, doc_off[d + 1] - doc_off[d])
    size = longest + 128
    scr = np.zeros(size, np.uint8)
    bnd = np.empty(size, np.int64)
    wh = np.empty(size // 2 + 64, np.uint64)
    offsets = np.zeros(n_docs + 1, np.int64)
    values = np.empty(max(16, buf.shape[0] // 2 + 16), np.uint64)
    for d in range(n_docs):
        while True:
            nw = _word_hashes64(buf, doc_off[d], doc_off[d + 1], tables, scr, bnd, wh)
            if nw >= 0:
                break
            size *= 2
            scr = np.zeros(size, np.uint8)
            bnd = np.empty(size, np.int64)
            wh = np.empty(size // 2 + 64, np.uint64)
        if nw == 0:
            offsets[d + 1] = offsets[d]
            continue
        nsh = 1 if nw < ngram else nw - ngram + 1
        width = min(nw, ngram)
        hv = np.empty(nsh, np.uint64)
        for w in range(nsh):
            h = np.uint64(0)
            for q in range(width):
                h = h * base + wh[w + q]
            hv[w] = h
        hv.sort()
        start = offsets[d]
        if start + nsh > values.shape[0]:
            grown = np.empty(2 * (start + nsh), np.uint64)
            grown[:start] = values[:start]
            values = grown
        m = 0
        for w in range(nsh):
            if w == 0 or hv[w] != hv[w - 1]:
                values[start + m] = hv[w]
                m += 1
        offsets[d + 1] = start + m
    return values[:offsets[n_docs]].copy(), offsets


def shingle_sets(texts: Iterable[str], ngram: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Exact shingle sets of ``texts`` as sorted unique 64-bit hashes (see the module
    docstring for the hash and its collision bound).

    Returns ``(values, offsets)``: uint64 ``(total,)`` and int64 ``(n_docs + 1,)``;
    document d's set is ``values[offsets[d]:offsets[d + 1]]`` (empty for a document
    without words). Memory: 8 bytes per distinct shingle.

    Raises:
        ValueError: ``ngram < 1``.
    """
    if ngram < 1:
        raise ValueError(f"ngram must be >= 1, got {ngram}")
    batch = [t.encode("utf-8", "surrogatepass") for t in texts]
    lens = np.fromiter(map(len, batch), np.int64, len(batch))
    off = np.zeros(len(batch) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    batch.append(_PAD)
    buf = np.frombuffer(b"".join(batch), np.uint8)
    return _shingle_sets_kernel(buf, off, int(ngram), char_tables(),
                                np.uint64(SHINGLE_BASE64))


@numba.njit(cache=True, nogil=True)
def sorted_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard ``|a & b| / |a | b|`` of two sorted unique uint64 arrays (merge, O(len(a)
    + len(b))); 0.0 when both are empty."""
    i = 0
    j = 0
    inter = 0
    na = a.shape[0]
    nb = b.shape[0]
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        if x == y:
            inter += 1
            i += 1
            j += 1
        elif x < y:
            i += 1
        else:
            j += 1
    union = na + nb - inter
    return inter / union if union else 0.0
