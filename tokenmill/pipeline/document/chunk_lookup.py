"""Whitespace chunks of UTF-8 text looked up in a hash table, in numba.

:mod:`tokenmill.pipeline.document.analysis` gives every distinct whitespace chunk a dense
id. Looking the chunks of a document up in a Python dict costs a string hash and a
compare per chunk, on strings ``str.split`` just allocated; here the text's UTF-8 bytes are
split and looked up in one numba pass: FNV-1a 64-bit hash of the chunk's bytes, linear
probing, the stored bytes compared, so an id is only ever given to the same chunk.

Chunks end at exactly the characters ``str.split()`` splits at (Unicode ``White_Space``
plus U+001C..U+001F: TAB, LF, VT, FF, CR, FS, GS, RS, US, SPACE, NEL, NBSP, OGHAM SPACE
MARK, U+2000..U+200A, LS, PS, NNBSP, MMSP, IDEOGRAPHIC SPACE).
"""

from __future__ import annotations

import numba
import numpy as np

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@numba.njit(cache=True, inline="always")
def _space_len(buf, i):
    """Bytes of the whitespace character starting at ``buf[i]`` (0: not whitespace)."""
    c = buf[i]
    if c < 0x80:
        return 1 if (c == 0x20 or (0x09 <= c <= 0x0D) or (0x1C <= c <= 0x1F)) else 0
    n = buf.shape[0]
    if c == 0xC2 and i + 1 < n and (buf[i + 1] == 0x85 or buf[i + 1] == 0xA0):
        return 2
    if i + 2 >= n:
        return 0
    d, e = buf[i + 1], buf[i + 2]
    if c == 0xE1 and d == 0x9A and e == 0x80:
        return 3
    if c == 0xE2 and d == 0x80 and (e <= 0x8A or e == 0xA8 or e == 0xA9 or e == 0xAF):
        return 3
    if c == 0xE2 and d == 0x81 and e == 0x9F:
        return 3
    if c == 0xE3 and d == 0x80 and e == 0x80:
        return 3
    return 0


@numba.njit(cache=True)
def _hash(buf, a, b):
    h = _FNV_OFFSET
    for i in range(a, b):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@numba.njit(cache=True)
def _find(buf, a, b, h, keys, slot_ids, store, store_start):
    """Slot of the chunk ``buf[a:b]`` with hash ``h``: where it is, or the empty slot
    where it would go."""
    mask = np.uint64(keys.shape[0] - 1)
    s = h & mask
    while slot_ids[s] != -1:
        if keys[s] == h:
            i = slot_ids[s]
            p, q = store_start[i], store_start[i + 1]
            if q - p == b - a:
                same = True
                for k in range(b - a):
                    if store[p + k] != buf[a + k]:
                        same = False
                        break
                if same:
                    return s
        s = (s + np.uint64(1)) & mask
    return s


@numba.njit(cache=True)
def lookup(buf, keys, slot_ids, store, store_start):
    """(int32[m] id per chunk or -1 when unknown, int64[m] first byte, int64[m] end
    byte) of the m whitespace chunks of the UTF-8 bytes ``buf``."""
    n = buf.shape[0]
    ids = np.empty(n // 2 + 1, np.int32)
    starts = np.empty(n // 2 + 1, np.int64)
    ends = np.empty(n // 2 + 1, np.int64)
    m = 0
    i = 0
    while i < n:
        w = _space_len(buf, i)
        if w:
            i += w
            continue
        a = i
        while i < n and _space_len(buf, i) == 0:
            i += 1
        s = _find(buf, a, i, _hash(buf, a, i), keys, slot_ids, store, store_start)
        ids[m] = slot_ids[s]
        starts[m] = a
        ends[m] = i
        m += 1
    return ids[:m], starts[:m], ends[:m]


@numba.njit(cache=True)
def insert(keys, slot_ids, store, store_start, first):
    """Put chunks ``first..`` of ``store`` (ids = their index) into the table."""
    for i in range(first, store_start.shape[0] - 1):
        a, b = store_start[i], store_start[i + 1]
        h = _hash(store, a, b)
        s = _find(store, a, b, h, keys, slot_ids, store, store_start)
        keys[s] = h
        slot_ids[s] = i
