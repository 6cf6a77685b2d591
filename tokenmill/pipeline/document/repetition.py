"""Repetition within one document, in numba: Gopher repetition's n-gram measures, and the
duplicate lines and paragraphs that Gopher repetition and FineWeb count.

Rae et al. (2021), appendix A.1.1, table A1: the characters covered by the most frequent
word n-gram (n = 2, 3, 4) and the characters in duplicated n-grams (n = 5 .. 10), counted
as datatrove's ``GopherRepetitionFilter`` counts them (``find_top_duplicate``,
``find_all_duplicate``).

Words come as 64-bit hashes of their code points (equal words, equal hashes); an n-gram's
key is built from its words' hashes incrementally, n after n (the key of n + 1 words from
the key of n). Only the positions whose n-gram occurs more than once are carried to
n + 1 (an (n + 1)-gram repeats only where the n-grams at its start and one word later
both do), so after the first sizes the passes touch a few percent of the words. n-grams
are grouped in one open-addressing hash table (linear probing, Fibonacci hashing; Knuth, TAOCP
vol. 3, 6.4) allocated once per document and reused for every n by a generation stamp per
slot, not by sorting. Two distinct n-grams share a key with probability ~2^-64 per pair.

Lines and paragraphs are compared the same way, by a 64-bit hash of their code points
(:func:`_segment_hash`) in the same kind of table, over the text's code
points (:func:`~.analysis.code_points`); :func:`duplicates` gives what datatrove's
``find_duplicates`` gives for the list of segments.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numba
import numpy as np

from tokenmill.pipeline.document.analysis import FLAGS, SPACE, STERM

_MIX = np.int64(1000003)  # the key of n + 1 words: key(n) * _MIX ^ hash(word n + 1)


@numba.njit(cache=True, inline="always")
def _slot(slot_gen, slot_key, gen, key, bits, mask):
    """The slot holding ``key`` in this generation, or the empty one where it goes."""
    s = (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)
    while slot_gen[s] == gen and slot_key[s] != key:
        s = (s + np.uint64(1)) & mask
    return s


@numba.njit(cache=True)
def _count_grams(keys, pos, n_pos, slot_of, slot_gen, slot_key, slot_count, slot_first,
                 gen, bits):
    """Count the n-grams ``keys[pos[:n_pos]]`` in the table (generation ``gen``), each
    position's slot in ``slot_of``; keep in ``pos`` (in order) the positions whose n-gram
    occurs twice or more. Returns (their number, the most frequent one's count, its first
    position; ties to the n-gram seen first), count 0 when none repeats."""
    mask = np.uint64((1 << bits) - 1)
    for j in range(n_pos):
        p = pos[j]
        s = _slot(slot_gen, slot_key, gen, keys[p], bits, mask)
        if slot_gen[s] != gen:
            slot_gen[s], slot_key[s], slot_count[s], slot_first[s] = gen, keys[p], 0, p
        slot_count[s] += 1
        slot_of[j] = s
    n_rep, best_c, best_i = 0, 0, 0
    for j in range(n_pos):
        s = slot_of[j]
        c, f = slot_count[s], slot_first[s]
        if c < 2:
            continue
        pos[n_rep] = pos[j]
        n_rep += 1
        if c > best_c or (c == best_c and f < best_i):
            best_c, best_i = c, f
    return n_rep, best_c, best_i


@numba.njit(cache=True)
def _dup_chars(keys, pos, n_pos, n, csum, slot_gen, slot_key, gen, bits):
    """Characters in repeated n-grams, skipping past each repeat (an n-gram skipped over is
    not remembered, as in datatrove's ``find_all_duplicate``), walking only the positions
    ``pos[:n_pos]`` (in order) whose n-gram occurs twice or more: an n-gram that occurs
    once is never found again, so passing it changes nothing but the position."""
    mask = np.uint64((1 << bits) - 1)
    chars = 0
    after = 0  # the first position the walk has not skipped
    for j in range(n_pos):
        p = pos[j]
        if p < after:
            continue
        s = _slot(slot_gen, slot_key, gen, keys[p], bits, mask)
        if slot_gen[s] == gen:
            chars += csum[p + n] - csum[p]
            after = p + n
        else:
            slot_gen[s], slot_key[s] = gen, keys[p]
            after = p + 1
    return chars


@numba.njit(cache=True)
def _extend_repeats(keys, wh, pos, n_pos, n):
    """The positions that may start a repeated n-gram (``n`` >= 2), from ``pos[:n_pos]``,
    the sorted positions of the repeated (n - 1)-grams: an n-gram at ``p`` repeats only
    if the (n - 1)-grams at ``p`` and ``p + 1`` do. Kept in ``pos`` (in order), their
    ``keys`` made those of n words; returns how many."""
    k = 0
    for j in range(n_pos - 1):
        p = pos[j]
        if pos[j + 1] == p + 1:
            keys[p] = (keys[p] * _MIX) ^ wh[p + n - 1]
            pos[k] = p
            k += 1
    return k


@numba.njit(cache=True)
def ngram_stats(wh, wl, top_ns, dup_ns):
    """Gopher repetition's n-gram measures of one document.

    Args:
        wh: int64[words] word hashes; wl: int64[words] word lengths (characters).
        top_ns, dup_ns: int64 arrays of n-gram sizes (>= 1).

    Returns:
        (int64[len(top_ns)], int64[len(dup_ns)]): per n of ``top_ns`` the characters of
        the most frequent n-gram (its words joined by one space) times its count, ties to
        the first seen; per n of ``dup_ns`` the characters in duplicated n-grams, after a
        repeat skipping past it. 0 where the document has fewer than n words.

    Sizes are taken from the smallest up, each over only the positions whose n-gram may
    occur more than once (found among those of the (n - 1)-grams,
    :func:`_extend_repeats`): most words of a text start no repeated 3-gram, so the
    larger sizes cost little.
    """
    nw = wh.shape[0]
    top = np.zeros(top_ns.shape[0], np.int64)
    dup = np.zeros(dup_ns.shape[0], np.int64)
    max_n, min_n = 0, nw + 1
    for n in np.concatenate((top_ns, dup_ns)):
        max_n, min_n = max(max_n, n), min(min_n, n)
    if max_n == 0 or min_n > nw:
        return top, dup
    csum = np.zeros(nw + 1, np.int64)
    for i in range(nw):
        csum[i + 1] = csum[i] + wl[i]
    bits = 1
    while (1 << bits) < 2 * nw:
        bits += 1
    slot_gen = np.zeros(1 << bits, np.int64)
    slot_key = np.empty(1 << bits, np.int64)
    slot_count = np.empty(1 << bits, np.int64)
    slot_first = np.empty(1 << bits, np.int64)
    slot_of = np.empty(nw, np.int64)
    keys = wh.copy()
    for n in range(2, min_n + 1):  # the keys of the smallest size, at every position
        for i in range(nw - n + 1):
            keys[i] = (keys[i] * _MIX) ^ wh[i + n - 1]
    pos = np.arange(nw - min_n + 1)
    n_pos, gen = pos.shape[0], 0
    for n in range(min_n, min(max_n, nw) + 1):
        if n > min_n:
            n_pos = _extend_repeats(keys, wh, pos, n_pos, n)
        gen += 1
        n_pos, best_c, best_i = _count_grams(keys, pos, n_pos, slot_of, slot_gen, slot_key,
                                             slot_count, slot_first, gen, bits)
        if n_pos == 0:  # every n-gram occurs once: the most frequent is the first
            best_c, best_i = 1, 0
        for t in range(top_ns.shape[0]):
            if top_ns[t] == n:
                top[t] = (csum[best_i + n] - csum[best_i] + n - 1) * best_c
        for t in range(dup_ns.shape[0]):
            if dup_ns[t] == n and n_pos:
                gen += 1
                dup[t] = _dup_chars(keys, pos, n_pos, n, csum, slot_gen, slot_key, gen,
                                    bits)
    return top, dup


@numba.njit(cache=True, inline="always")
def _segment_hash(cp, a, b):
    """int64 hash of the code points ``cp[a:b]``: two FNV-1a lanes over the even and the
    odd offsets side by side (half the multiply chain of one lane), then mixed and
    finished as :func:`~.analysis.code_point_hash` finishes."""
    prime = np.uint64(0x100000001B3)
    h0, h1 = np.uint64(0xCBF29CE484222325), np.uint64(0x84222325CBF29CE4)
    i = a
    while i + 1 < b:
        h0 = (h0 ^ np.uint64(cp[i])) * prime
        h1 = (h1 ^ np.uint64(cp[i + 1])) * prime
        i += 2
    if i < b:
        h0 = (h0 ^ np.uint64(cp[i])) * prime
    h = h0 ^ ((h1 << np.uint64(31)) | (h1 >> np.uint64(33)))
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return np.int64(h)


@numba.njit(cache=True)
def _segment_duplicates(cp, starts, ends):
    n = starts.shape[0]
    bits = 1
    while (1 << bits) < 2 * n + 2:
        bits += 1
    mask = np.uint64((1 << bits) - 1)
    slot_gen = np.zeros(1 << bits, np.int64)
    slot_key = np.empty(1 << bits, np.int64)
    n_dup, dup_chars = 0, 0
    for j in range(n):
        key = _segment_hash(cp, starts[j], ends[j]) ^ (ends[j] - starts[j])
        s = _slot(slot_gen, slot_key, 1, key, bits, mask)
        if slot_gen[s] == 1:
            n_dup += 1
            dup_chars += ends[j] - starts[j]
        else:
            slot_gen[s], slot_key[s] = 1, key
    return n_dup, dup_chars


@numba.njit(cache=True)
def _line_segments(cp, nonblank, flags):
    """Segments of ``text.split("\n")``: the non-empty ones (``nonblank``: the ones not
    only whitespace either) as int64 (starts, ends)."""
    n = cp.shape[0]
    starts = np.empty(n + 1, np.int64)
    ends = np.empty(n + 1, np.int64)
    k = 0
    a = 0
    for i in range(n + 1):
        if i == n or cp[i] == 10:
            keep = i > a
            if keep and nonblank:
                keep = False
                for j in range(a, i):
                    if not flags[cp[j]] & SPACE:
                        keep = True
                        break
            if keep:
                starts[k], ends[k] = a, i
                k += 1
            a = i + 1
    return starts[:k], ends[:k]


@numba.njit(cache=True)
def _para_segments(cp, flags):
    """Segments of ``re.split(r"\n{2,}", text.strip())`` as int64 (starts, ends)."""
    a, b = 0, cp.shape[0]
    while a < b and flags[cp[a]] & SPACE:
        a += 1
    while b > a and flags[cp[b - 1]] & SPACE:
        b -= 1
    starts = np.empty(b - a + 1, np.int64)
    ends = np.empty(b - a + 1, np.int64)
    k = 0
    seg = a
    i = a
    while i < b:
        if cp[i] == 10 and i + 1 < b and cp[i + 1] == 10:
            starts[k], ends[k] = seg, i
            k += 1
            while i < b and cp[i] == 10:
                i += 1
            seg = i
        else:
            i += 1
    starts[k], ends[k] = seg, b
    return starts[:k + 1], ends[:k + 1]


def duplicates(cp: np.ndarray, part: str
               ) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    """Duplicate segments of a text (``cp``: its uint32 code points): (segments,
    repeated segments, characters in them, both first occurrences excluded), and the
    segments' int64 (starts, ends). ``part``: ``"para"`` (``re.split(r"\n{2,}",
    text.strip())``), ``"line"`` (Gopher's: the non-empty segments of
    ``text.split("\n")``, after ``""`` if the text starts with a newline, before ``""``
    if it ends with one) or ``"nonblank"`` (FineWeb's: the segments of
    ``text.split("\n")`` that are not empty nor only whitespace)."""
    if part == "para":
        starts, ends = _para_segments(cp, FLAGS)
    else:
        starts, ends = _line_segments(cp, part == "nonblank", FLAGS)
    n_dup, dup_chars = _segment_duplicates(cp, starts, ends)
    n = len(starts)
    if part == "line" and len(cp) and cp[0] == 10:
        n += 1
    if part == "line" and len(cp) and cp[-1] == 10:
        n += 1
        n_dup += cp[0] == 10  # the second "" repeats the first
    return n, int(n_dup), int(dup_chars), starts, ends


@numba.njit(cache=True)
def gopher_duplicates(cp, flags):
    """:func:`duplicates` of ``"para"`` then of ``"line"`` in one call: int64 (paragraphs,
    repeated ones, characters in them, lines, repeated ones, characters in them)."""
    starts, ends = _para_segments(cp, flags)
    n_paras = starts.shape[0]
    p_dup, p_chars = _segment_duplicates(cp, starts, ends)
    starts, ends = _line_segments(cp, False, flags)
    l_dup, l_chars = _segment_duplicates(cp, starts, ends)
    n_lines = starts.shape[0]
    if cp.shape[0] and cp[0] == 10:  # "" before the first line
        n_lines += 1
    if cp.shape[0] and cp[cp.shape[0] - 1] == 10:  # "" after the last, repeating the first
        n_lines += 1
        if cp[0] == 10:
            l_dup += 1
    return n_paras, p_dup, p_chars, n_lines, l_dup, l_chars


@numba.njit(cache=True)
def fineweb_lines(cp, flags, short_length):
    """FineWeb's line measures of a text (``cp``: its code points; ``flags``:
    :data:`~.analysis.FLAGS`) in one call: int64 (non-blank lines, characters in the
    repeated ones as :func:`duplicates` counts them, lines ending in a sentence terminal,
    lines of at most ``short_length`` code points, newlines), the lines as
    ``"nonblank"``."""
    starts, ends = _line_segments(cp, True, flags)
    _, dup_chars = _segment_duplicates(cp, starts, ends)
    n_term, n_short = line_ends_counts(cp, flags, starts, ends, short_length)
    n_newlines = 0
    for c in cp:
        n_newlines += c == 10
    return starts.shape[0], dup_chars, n_term, n_short, n_newlines


@numba.njit(cache=True)
def line_ends_counts(cp, flags, starts, ends, short_length):
    """(lines ending in a sentence terminal, lines of at most ``short_length`` code
    points) over the non-empty segments ``cp[starts[j]:ends[j]]`` (``flags``:
    :data:`~.analysis.FLAGS`)."""
    n_term, n_short = 0, 0
    for j in range(starts.shape[0]):
        if flags[cp[ends[j] - 1]] & STERM:
            n_term += 1
        if ends[j] - starts[j] <= short_length:
            n_short += 1
    return n_term, n_short


def _top_ngram_chars(words: Sequence[str], n: int) -> int:
    """Characters covered by the most frequent word n-gram (len * count; when every n-gram
    is unique, the first one: Gopher's "most frequent n-gram", as datatrove counts it).
    0 when the text has fewer than n words.
    Pure-Python reference of :func:`ngram_stats`."""
    grams = Counter(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return len(gram) * count


def _dup_ngram_chars(words: Sequence[str], n: int) -> int:
    """Characters in duplicated word n-grams, non-overlapping (datatrove
    ``find_all_duplicate``: after a repeat, skip past it). Pure-Python reference of
    :func:`ngram_stats` (which compares n-grams word by word, where datatrove compares the
    words concatenated without separator)."""
    seen: set[str] = set()
    chars = 0
    i = 0
    last = len(words) - n + 1
    while i < last:
        gram = "".join(words[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


def _split_lines(text: str) -> list[str]:
    """``re.split(r"\n+", text)`` of a non-empty text, without the regex: the non-empty
    lines, after a ``""`` if the text starts with a newline, before one if it ends so."""
    lines = [ln for ln in text.split("\n") if ln]
    if text[0] == "\n":
        lines.insert(0, "")
    if text[-1] == "\n":
        lines.append("")
    return lines


def _find_duplicates(items: Sequence[str]) -> tuple[int, int]:
    """(number of repeated elements, characters in them), first occurrences excluded
    (Gopher / datatrove ``find_duplicates``)."""
    distinct = dict.fromkeys(items)  # equal items have equal lengths
    return len(items) - len(distinct), sum(map(len, items)) - sum(map(len, distinct))
