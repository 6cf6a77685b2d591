"""The repeated token spans of exact-substring dedup (Lee et al. 2022, "Deduplicating
Training Data Makes Language Models Better", ExactSubstr), found with a suffix array.

The rule: with ``k = min_tokens``, a *window* is ``k`` consecutive tokens of one document;
a window is *repeated* when the same ``k`` tokens start at an earlier place in the global
document order (earlier in the same document included). Every token covered by a repeated
window is removed. So every span of ``k`` or more tokens that occurs more than once keeps
its first occurrence and loses all the others, and nothing shorter than ``k`` tokens is
ever cut on its own.

A *part* is a run of documents in the global order, laid out as one int32 text: each
document's tokens followed by a separator id larger than every token (so that no window
spans two documents). Per part (:func:`part_windows`): its suffix array (libdivsufsort,
:func:`tokenmill.suffixarray.integer_suffix_array`, so that suffixes compare as the
integer ids in every part alike) and LCP array group the suffixes sharing their first
``k`` tokens; in each group the smallest position is the part's first occurrence (its
*representative*), the others are repeated. Across parts (:func:`found_in`): a part's
representatives, in suffix-array order, are merged with every earlier part's; a
representative found in an earlier part is repeated too.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from tokenmill.suffixarray import integer_suffix_array, rank_lcp


def layout(docs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One part's text: ``(text int32[sum(len) + len(docs)], starts int64[len(docs) + 1])``;
    document ``i`` is ``text[starts[i] : starts[i + 1] - 1]``, followed by the separator
    (the largest id plus one)."""
    lengths = np.fromiter((d.size + 1 for d in docs), np.int64, count=len(docs))
    starts = np.zeros(len(docs) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    sep = max((int(d.max()) for d in docs if d.size), default=0) + 1
    text = np.full(int(starts[-1]), sep, np.int32)
    for s, d in zip(starts[:-1], docs, strict=True):
        text[s : s + d.size] = d
    return text, starts


@nb.njit(cache=True)
def _valid_windows(text, k):
    """valid[p]: the ``k`` tokens from p hold no separator (the text's largest id)."""
    n = text.size
    sep = text.max() if n else 0
    valid = np.zeros(n, np.bool_)
    run = 0
    for p in range(n - 1, -1, -1):
        run = 0 if text[p] == sep else run + 1
        valid[p] = run >= k
    return valid


@nb.njit(cache=True)
def _groups(sa, lcp, valid, k):
    """Per group of suffixes sharing ``k`` tokens (a run of ``lcp >= k``): its smallest
    position (a representative, in suffix-array order) and its other positions."""
    n = sa.size
    later = np.empty(n, np.int32)
    reps = np.empty(n, np.int32)
    nl = 0
    nr = 0
    r = 0
    while r < n:
        e = r + 1
        while e < n and lcp[e] >= k:
            e += 1
        if valid[sa[r]]:  # the group shares k tokens: all valid or none
            m = sa[r]
            for i in range(r + 1, e):
                m = min(m, sa[i])
            reps[nr] = m
            nr += 1
            for i in range(r, e):
                if sa[i] != m:
                    later[nl] = sa[i]
                    nl += 1
        r = e
    return later[:nl], reps[:nr]


def part_windows(text: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The windows of one part (:func:`layout`'s ``text``).

    Returns:
        ``(repeated, reps)``: int32 start positions of the windows repeated inside the
        part (sorted), and of the first occurrence of every distinct window of the part
        (its representatives, sorted by the window's tokens as integers).
    """
    if text.size == 0:
        return np.empty(0, np.int32), np.empty(0, np.int32)
    sa = np.ascontiguousarray(integer_suffix_array(text), np.int32)
    _, lcp = rank_lcp(text, sa)
    later, reps = _groups(sa, lcp, _valid_windows(text, k), k)
    return np.sort(later), reps


@nb.njit(cache=True)
def _compare(ta, pa, tb, pb, k):
    for i in range(k):
        x = ta[pa + i]
        y = tb[pb + i]
        if x != y:
            return -1 if x < y else 1
    return 0


@nb.njit(cache=True)
def found_in(ta, ra, tb, rb, k):
    """bool[len(ra)]: whether the window of text ``ta`` at ``ra[i]`` occurs in text
    ``tb`` among the windows ``rb`` (both sorted by their tokens, :func:`part_windows`'s
    ``reps``); one merge, ``O((len(ra) + len(rb)) k)``."""
    out = np.zeros(ra.size, np.bool_)
    j = 0
    for i in range(ra.size):
        while j < rb.size and _compare(tb, rb[j], ta, ra[i], k) < 0:
            j += 1
        if j < rb.size and _compare(tb, rb[j], ta, ra[i], k) == 0:
            out[i] = True
    return out


def covered_spans(starts: np.ndarray, k: int, n: int) -> np.ndarray:
    """The union of the windows ``[s, s + k)`` for ``s`` in ``starts`` in a text of ``n``
    tokens, as disjoint sorted ``[start, end)`` spans: int64[m, 2]."""
    if starts.size == 0:
        return np.empty((0, 2), np.int64)
    diff = np.zeros(n + 1, np.int32)
    np.add.at(diff, starts, 1)
    np.add.at(diff, np.asarray(starts, np.int64) + k, -1)
    cover = np.cumsum(diff[:n]) > 0
    edges = np.flatnonzero(np.diff(np.concatenate(([False], cover, [False])).astype(np.int8)))
    return edges.reshape(-1, 2).astype(np.int64)


def token_byte_offsets(text: str, tokens: np.ndarray, token_bytes: np.ndarray
                       ) -> np.ndarray | None:
    """UTF-8 byte offset of every token boundary of ``text`` (int64[len(tokens) + 1]);
    ``None`` when the tokens' bytes (``token_bytes``: bytes per id) do not add up to the
    text's UTF-8 bytes."""
    size = len(text.encode("utf-8", "surrogatepass"))
    ends = np.concatenate(([0], np.cumsum(token_bytes[tokens], dtype=np.int64)))
    return ends if int(ends[-1]) == size else None


def char_span(raw_starts: np.ndarray, byte_ends: np.ndarray, t0: int, t1: int
              ) -> tuple[int, int]:
    """Characters ``[c0, c1)`` covering the bytes of tokens ``[t0, t1)``: ``raw_starts``
    is int64[bytes + 1], the count of UTF-8 lead bytes before each byte offset; a span
    that starts or ends inside a character takes the whole character."""
    b0, b1 = int(byte_ends[t0]), int(byte_ends[t1])
    c0 = int(raw_starts[b0])
    if b0 < raw_starts.size - 1 and raw_starts[b0 + 1] == raw_starts[b0]:
        c0 -= 1  # byte b0 continues a character: cut it whole
    return c0, int(raw_starts[b1])


def lead_counts(text: str) -> np.ndarray:
    """int64[bytes + 1]: UTF-8 lead bytes (characters started) before each byte offset."""
    raw = np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
    out = np.zeros(raw.size + 1, np.int64)
    np.cumsum((raw & 0xC0) != 0x80, out=out[1:])
    return out


def repeated_token_spans(docs: list[np.ndarray], k: int, part_tokens: int
                         ) -> list[np.ndarray]:
    """The whole search in one process (for tests and benchmarks; the stage runs the
    same steps as Ray tasks): ``docs`` cut into parts of about ``part_tokens`` tokens,
    :func:`part_windows` per part, :func:`found_in` against every earlier part.

    Returns:
        per document, int64[m, 2]: its ``[start, end)`` token spans to cut.
    """
    bounds = [0]
    size = 0
    for i, d in enumerate(docs):
        if size and size + d.size > part_tokens:
            bounds.append(i)
            size = 0
        size += d.size
    bounds.append(len(docs))
    parts = []
    out: list[np.ndarray] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        text, starts = layout(docs[lo:hi])
        repeated, reps = part_windows(text, k)
        found = np.zeros(reps.size, np.bool_)
        for other, other_reps in parts:
            found |= found_in(text, reps, other, other_reps, k)
        parts.append((text, reps))
        cut = covered_spans(np.concatenate((repeated, reps[found])), k, text.size)
        doc_of = np.searchsorted(starts, cut[:, 0], side="right") - 1
        for j in range(hi - lo):
            mine = cut[doc_of == j]
            out.append(mine - starts[j])
    return out
