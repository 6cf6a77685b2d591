"""A document split into words once, for every quality filter that reads it.

The quality filters (Gopher quality and repetition, C4, FineWeb) all need the words of
:func:`tokenmill.pipeline.document.words.split_words`, and they run one after another over
a whole block. Splitting is the costly part, and it is a function of each whitespace
chunk alone, so this module keeps:

* a process-wide **chunk table**: each distinct whitespace chunk gets a dense id, split
  once (in Python, the spaCy-like rules) into its words, from which per-chunk numbers are
  kept in numpy arrays: word count, non-punctuation words, their characters, words
  holding a letter, the sentencizer's transition (:func:`~.words.count_sentences` over
  the chunk's words, from either state) and the flat hash and length of each word;
* a per-text cache of the text's chunk ids (``int32[chunks]``), keyed by the identity of
  the text object (the entry holds the text, so an id is never reused while cached): the
  second filter to look at a document pays one dictionary lookup.

Everything a filter needs is then a numpy gather over chunk ids (totals, word hashes for
the n-gram kernel), with no word list built. The table is reset when it holds
``MAX_CHUNKS`` chunks (a new generation: cached ids of the old one are recomputed), the
text cache is emptied when it holds ``MAX_CACHED_IDS`` ids; :func:`release` empties it at
once (call it when a block's document stages are done, to free the memory early).
"""

from __future__ import annotations

import itertools

import numba
import numpy as np

from tokenmill.pipeline.document.words import (
    SENTENCE_TERMINALS,
    is_punct_word,
    split_chunk,
)

MAX_CHUNKS = 1_000_000
MAX_CACHED_IDS = 8_000_000

#: columns of the per-chunk statistics
N_WORDS, N_CONTENT, CONTENT_CHARS, N_ALPHA = 0, 1, 2, 3


class _ChunkTable:
    """Distinct chunks → dense ids, their words and per-chunk numbers (growing arrays)."""

    def __init__(self, generation: int = 0) -> None:
        self.generation = generation
        self.ids: dict[str, int] = {}
        self.words: list[tuple[str, ...]] = []
        self.stats = np.zeros((1024, 4), np.int64)
        self.sentences = np.zeros((1024, 4), np.int8)  # inc, out from state 0; from 1
        self.word_start = np.zeros(1025, np.int64)
        self.word_hash = np.zeros(4096, np.int64)
        self.word_len = np.zeros(4096, np.int64)

    def _grow(self, chunks: int, words: int) -> None:
        if chunks > self.stats.shape[0]:
            cap = max(chunks, 2 * self.stats.shape[0])
            self.stats = np.resize(self.stats, (cap, 4))
            self.sentences = np.resize(self.sentences, (cap, 4))
            self.word_start = np.resize(self.word_start, cap + 1)
        if words > self.word_hash.shape[0]:
            cap = max(words, 2 * self.word_hash.shape[0])
            self.word_hash = np.resize(self.word_hash, cap)
            self.word_len = np.resize(self.word_len, cap)

    def add(self, new_chunks: set[str]) -> None:
        """Give each of ``new_chunks`` (none known yet) an id, its words and numbers."""
        chunks = list(new_chunks)
        first = len(self.words)
        new = [split_chunk(c) for c in chunks]
        n_words = sum(map(len, new))
        w0 = int(self.word_start[first])
        self._grow(first + len(new), w0 + n_words)
        flat = [w for ws in new for w in ws]
        self.word_hash[w0:w0 + n_words] = np.fromiter(map(hash, flat), np.int64, n_words)
        self.word_len[w0:w0 + n_words] = np.fromiter(map(len, flat), np.int64, n_words)
        end = first + len(new)
        self.ids.update(zip(chunks, range(first, end), strict=True))
        self.words += new
        self.stats[first:end] = [_chunk_numbers(ws) for ws in new]
        self.sentences[first:end] = [
            (0, 0, 1, 0) if len(ws) == 1 and ws[0].isalnum() else
            (*_sentence_step(ws, False), *_sentence_step(ws, True)) for ws in new]
        self.word_start[first + 1:end + 1] = w0 + np.cumsum(
            np.fromiter(map(len, new), np.int64, len(new)))


def _chunk_numbers(words: tuple[str, ...]) -> tuple[int, int, int, int]:
    """(words, non-punctuation words, their characters, words holding a letter)."""
    if len(words) == 1 and words[0].isalpha():  # most chunks
        return 1, 1, len(words[0]), 1
    content = [w for w in words if not is_punct_word(w)]
    return (len(words), len(content), sum(map(len, content)),
            sum(1 for w in words if any(map(str.isalpha, w))))


def _sentence_step(words: tuple[str, ...], seen_end: bool) -> tuple[int, int]:
    """(sentences started, state after) of :func:`~.words.count_sentences`'s loop over
    ``words`` entered with ``seen_end``."""
    n = 0
    for w in words:
        if w in SENTENCE_TERMINALS:
            seen_end = True
        elif seen_end and not is_punct_word(w):
            n += 1
            seen_end = False
    return n, int(seen_end)


_TABLE = _ChunkTable()
_TEXTS: dict[int, tuple[str, int, np.ndarray]] = {}
_CACHED_IDS = [0]


def table() -> _ChunkTable:
    """The process-wide chunk table (valid until the next :func:`chunk_ids` call)."""
    return _TABLE


def ids_of(chunks: list[str]) -> np.ndarray:
    """int32 chunk ids of ``chunks`` in the current table (new chunks are added)."""
    global _TABLE
    ids = np.fromiter(map(_TABLE.ids.get, chunks, itertools.repeat(-1)), np.int32,
                      len(chunks))
    if len(ids) and ids.min() < 0:
        missing = {chunks[i] for i in np.flatnonzero(ids < 0).tolist()}
        if len(_TABLE.words) + len(missing) > MAX_CHUNKS:
            _TABLE = _ChunkTable(_TABLE.generation + 1)
            missing = set(chunks)
        _TABLE.add(missing)
        ids = np.fromiter(map(_TABLE.ids.__getitem__, chunks), np.int32, len(chunks))
    return ids


def chunk_ids(text: str) -> np.ndarray:
    """int32 ids of the whitespace chunks of ``text`` (``text.split()``), in order, in
    the table :func:`table` returns right after; cached per text object."""
    hit = _TEXTS.get(id(text))
    if hit is not None and hit[0] is text and hit[1] == _TABLE.generation:
        return hit[2]
    ids = ids_of(text.split())
    if _CACHED_IDS[0] + len(ids) > MAX_CACHED_IDS:
        release()
    _TEXTS[id(text)] = (text, _TABLE.generation, ids)
    _CACHED_IDS[0] += len(ids)
    return ids


def release() -> None:
    """Forget every cached text (their chunk ids); the chunk table stays."""
    _TEXTS.clear()
    _CACHED_IDS[0] = 0


def totals(ids: np.ndarray) -> np.ndarray:
    """int64[4] sums over ``ids`` of the per-chunk statistics (word count, non-punctuation
    words, their characters, words holding a letter: Gopher's word statistics)."""
    return _sum_rows(_TABLE.stats, ids)


def word_hashes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 hash, int64 length) of every word of the chunks ``ids``, in order."""
    t = _TABLE
    return _gather_words(t.word_start, t.word_hash, t.word_len, ids)


def sentences(ids: np.ndarray, line_starts: np.ndarray, line_ends: np.ndarray) -> int:
    """Total of :func:`~.words.count_sentences` over lines: line ``j`` is the chunks
    ``ids[line_starts[j]:line_ends[j]]``."""
    return int(_count_sentences(_TABLE.sentences, ids, line_starts, line_ends))


_STOP_MASKS: dict[tuple[str, ...], tuple[int, np.ndarray]] = {}


def stop_word_count(ids: np.ndarray, stop_words: tuple[str, ...]) -> int:
    """Distinct words of ``stop_words`` (sorted, at most 62) among the words of the
    chunks ``ids``: an OR of per-chunk bit masks, kept per stop list and generation."""
    gen, mask = _STOP_MASKS.get(stop_words, (-1, np.zeros(0, np.int64)))
    if gen != _TABLE.generation:
        mask = np.zeros(0, np.int64)
    if len(mask) < len(_TABLE.words):
        bit = {w: 1 << i for i, w in enumerate(stop_words)}
        new = [sum(bit.get(w, 0) for w in set(ws)) for ws in _TABLE.words[len(mask):]]
        mask = np.concatenate([mask, np.array(new, np.int64)])
    _STOP_MASKS[stop_words] = (_TABLE.generation, mask)
    return int(np.bitwise_or.reduce(mask[ids], initial=0)).bit_count()


@numba.njit(cache=True)
def _sum_rows(stats, ids):
    out = np.zeros(stats.shape[1], np.int64)
    for i in ids:
        for c in range(stats.shape[1]):
            out[c] += stats[i, c]
    return out


@numba.njit(cache=True)
def _gather_words(start, whash, wlen, ids):
    n = 0
    for i in ids:
        n += start[i + 1] - start[i]
    h = np.empty(n, np.int64)
    ln = np.empty(n, np.int64)
    p = 0
    for i in ids:
        for j in range(start[i], start[i + 1]):
            h[p] = whash[j]
            ln[p] = wlen[j]
            p += 1
    return h, ln


@numba.njit(cache=True)
def _count_sentences(trans, ids, line_starts, line_ends):
    total = 0
    for j in range(line_starts.shape[0]):
        a, b = line_starts[j], line_ends[j]
        if b == a:  # no words (every chunk has at least one): no sentence
            continue
        state = 0
        n = 1
        for p in range(a, b):
            i = ids[p]
            n += trans[i, 2 * state]
            state = trans[i, 2 * state + 1]
        total += n
    return total
