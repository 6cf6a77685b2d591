"""The chunks that the Python word splitter split, remembered in arrays for the numba scan.

:func:`~tokenmill.pipeline.document.analysis.split_text` splits about 2.5 % of the
whitespace chunks of web text (URLs, abbreviations, scripts with combining marks, ``and/or``)
with :func:`~tokenmill.pipeline.document.words.split_chunk` in Python. Many of them come
back (``U.S.``, ``Dr.``, ``//``, ``...``), so each split chunk's code points and word
lengths are kept here, and the word scan looks a chunk up (:func:`known_split`) before
leaving it to Python: a chunk seen before costs one probe, not a return to Python.

A chunk is found by its 64-bit hash (as :func:`~.analysis.code_point_hash` hashes its code
points) and then compared code point by code point, so a found split is always the split
of the same chunk. The table (:func:`new_table`) is a tuple of arrays: ``slots``
(int64[SLOTS], entry + 1, 0 where empty; linear probing, Fibonacci hashing), ``entries``
(int64[ENTRIES, 4]: hash, first code point in ``pool_cp``, code points, first in
``pool_len``), ``pool_cp`` (uint32 code points), ``pool_len`` (int64: word count, then the
words' lengths) and ``fill`` (int64[3]: entries, code points and lengths used). When a
pool is full the table keeps what it holds (the chunks seen first, the common ones: not
emptied, to thrash on a corpus of many distinct chunks) and learns no more until
:func:`clear`; chunks longer than ``LONGEST`` code points (mostly unique URLs) are not
kept. A chunk the table lacks is split in Python as before.
"""

from __future__ import annotations

import numba
import numpy as np

SLOT_BITS = 18
SLOTS = 1 << SLOT_BITS
ENTRIES = SLOTS // 2  # at most half the slots used
POOL_CODE_POINTS = 1 << 21
POOL_LENGTHS = 1 << 19
LONGEST = 100


def new_table() -> tuple[np.ndarray, ...]:
    """An empty table: (slots, entries, pool_cp, pool_len, fill), as the module says."""
    return (np.zeros(SLOTS, np.int64), np.zeros((ENTRIES, 4), np.int64),
            np.zeros(POOL_CODE_POINTS, np.uint32), np.zeros(POOL_LENGTHS, np.int64),
            np.zeros(3, np.int64))


def clear(table: tuple[np.ndarray, ...]) -> None:
    """Forget every chunk of ``table``."""
    table[0][:] = 0
    table[4][:] = 0


@numba.njit(cache=True, inline="always")
def _first_slot(key):
    return (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - SLOT_BITS)


@numba.njit(cache=True, inline="always")
def _find(cp, a, b, key, slots, entries, pool_cp):
    """The entry of the chunk ``cp[a:b]`` (hash ``key``), or -1."""
    s = _first_slot(key)
    while slots[s]:
        e = slots[s] - 1
        if entries[e, 0] == key and entries[e, 2] == b - a:
            at = entries[e, 1]
            same = True
            for i in range(b - a):
                if pool_cp[at + i] != cp[a + i]:
                    same = False
                    break
            if same:
                return e
        s = (s + np.uint64(1)) & np.uint64(SLOTS - 1)
    return -1


@numba.njit(cache=True, inline="always")
def known_split(cp, a, b, key, table, ends):
    """The words of the chunk ``cp[a:b]`` (hash ``key``) if the table holds it: their end
    offsets written to ``ends``, their number returned; -1 if it does not."""
    slots, entries, pool_cp, pool_len, _ = table
    e = _find(cp, a, b, key, slots, entries, pool_cp)
    if e < 0:
        return -1
    at = entries[e, 3]
    m = pool_len[at]
    end = a
    for t in range(m):
        end += pool_len[at + 1 + t]
        ends[t] = end
    return m


@numba.njit(cache=True)
def learn(cp, hard, keys, lengths, table):
    """Keep the splits of the chunks ``cp[hard[q, 1]:hard[q, 2]]`` (hashes ``keys[q]``;
    ``lengths``: per chunk in order its word count then its words' lengths), as long as
    the pools have room."""
    slots, entries, pool_cp, pool_len, fill = table
    p = 0
    for q in range(hard.shape[0]):
        a, b, m = hard[q, 1], hard[q, 2], lengths[p]
        if b - a <= LONGEST and _find(cp, a, b, keys[q], slots, entries, pool_cp) < 0:
            if fill[0] == ENTRIES or fill[1] + b - a > POOL_CODE_POINTS \
                    or fill[2] + m + 1 > POOL_LENGTHS:
                return
            e = fill[0]
            entries[e, 0], entries[e, 1], entries[e, 2], entries[e, 3] = \
                keys[q], fill[1], b - a, fill[2]
            pool_cp[fill[1]:fill[1] + b - a] = cp[a:b]
            pool_len[fill[2]:fill[2] + m + 1] = lengths[p:p + m + 1]
            fill[0] += 1
            fill[1] += b - a
            fill[2] += m + 1
            s = _first_slot(keys[q])
            while slots[s]:
                s = (s + np.uint64(1)) & np.uint64(SLOTS - 1)
            slots[s] = e + 1
        p += m + 1
