"""A document split into words once, for every quality filter that reads it.

The quality filters (Gopher quality and repetition, C4, FineWeb) all need the words of
:func:`tokenmill.pipeline.document.words.split_words`, and they run one after another over
a whole block. :func:`analyze` splits a text once, in numba over its code points, into
word boundaries and per-word numbers, and caches the result per text object (the entry
holds the text, so an id is never reused while cached): the second filter to look at a
document pays one dictionary lookup.

The split follows :mod:`~tokenmill.pipeline.document.words` exactly: the text is cut into
whitespace chunks (``str.split()``), and the chunks of the common shapes (letters, digits,
closing and opening marks, hyphenated letters and numbers, units after numbers,
contractions: :func:`_split_kernel`) are split in numba; every other chunk (about 2.5 %
of the chunks of web text) is split by
:func:`~tokenmill.pipeline.document.words.split_chunk` in Python, cached per distinct
chunk, as word lengths (a chunk's words are its consecutive pieces). Per word the kernel
keeps its start and length (code points), a 64-bit hash of its code points (FNV-1a, then
a murmur finalizer: equal words, equal hashes), whether it is punctuation
(:func:`~.words.is_punct_word`), holds a letter, or is one sentence terminal; character
classes come from a table over every code point built from ``str`` methods and
:mod:`unicodedata` (:data:`FLAGS`; the code points above the Basic Multilingual Plane are
filled in when a text first holds them).

A filter that edits a text by keeping some of its lines (C4) hands the new text over with
:func:`remember_joined`: its analysis is then gathered from the old one's arrays when a
later filter first asks for it, not split again.

:func:`release` empties the per-text cache (call it when a block's document stages are
done, to free the memory early); it also empties itself past ``MAX_CACHED_WORDS`` words.
"""

from __future__ import annotations

import unicodedata

import numba
import numpy as np

from tokenmill.pipeline.document.words import (
    ABBREVIATIONS,
    PREFIX_MARKS,
    SENTENCE_TERMINALS,
    SUFFIX_MARKS,
    UNIT_WORDS,
    is_punct_char,
    split_chunk,
)

MAX_CACHED_WORDS = 8_000_000
MAX_CHUNK_CACHE = 500_000
MAX_JOINED = 10_000  # texts awaiting their joined analysis (a block's, and more)

#: indices of :meth:`TextWords.totals`
N_WORDS, N_CONTENT, CONTENT_CHARS, N_ALPHA = 0, 1, 2, 3

# per code point flags
(ALPHA, DIGIT, ALNUM, PUNCT, STERM, UPPER, TITLE, MARK, SPACE, PREFIX, SUFFIX,
 LOWER_ASCII) = (1 << i for i in range(12))
_KNOWN = 1 << 15  # the entry has been filled in

_CANNOT = np.array([ord(c) for c in "cannot"], np.uint32)

# per word kinds
_K_PUNCT, _K_ALPHA, _K_STERM = 1, 2, 4



def _flags_of(c: int) -> int:
    ch = chr(c)
    cat = unicodedata.category(ch)
    return (_KNOWN | ALPHA * ch.isalpha() | DIGIT * ch.isdigit() | ALNUM * ch.isalnum()
            | PUNCT * is_punct_char(ch) | STERM * (ch in SENTENCE_TERMINALS)
            | UPPER * ch.isupper() | TITLE * ch.istitle() | MARK * (cat[0] == "M")
            | SPACE * ch.isspace() | PREFIX * (ch in PREFIX_MARKS)
            | SUFFIX * (ch in SUFFIX_MARKS)
            | LOWER_ASCII * (c >= 128 and any(map(str.isascii, ch.lower()))))


#: uint16 flags per code point (``ALPHA``: ``str.isalpha``, ``DIGIT``: ``isdigit``,
#: ``ALNUM``: ``isalnum``, ``PUNCT``: :func:`~.words.is_punct_char`, ``STERM``: a
#: sentence terminal, ``UPPER``/``TITLE``: ``isupper``/``istitle``, ``MARK``: category M,
#: ``SPACE``: ``isspace``, ``PREFIX``/``SUFFIX``: one of :data:`~.words.PREFIX_MARKS` /
#: :data:`~.words.SUFFIX_MARKS`, ``LOWER_ASCII``: not ASCII, lower-cased holds ASCII);
#: filled for the BMP now, above it on first sight
FLAGS = np.zeros(0x110000, np.uint16)
FLAGS[:0x10000] = [_flags_of(c) for c in range(0x10000)]


def _fill_flags(cp: np.ndarray) -> None:
    """Fill the :data:`FLAGS` entries of the astral code points of ``cp``."""
    high = cp[cp >= 0x10000]
    if len(high):
        todo = np.unique(high)
        todo = todo[FLAGS[todo] == 0]
        FLAGS[todo] = [_flags_of(int(c)) for c in todo]


class TextWords:
    """The words of one text (in :func:`~.words.split_words`'s order) as arrays.

    ``chunk_word``: int64[chunks + 1], chunk ``i`` (of ``text.split()``) holds words
    ``chunk_word[i]:chunk_word[i + 1]``; ``word_hash``, ``word_len``: int64[words] (hash
    of the code points, length in code points); ``word_kind``: uint8[words] bits
    punctuation / holds a letter / one sentence terminal; ``totals``: int64[4] (words,
    non-punctuation words, their characters, words holding a letter: Gopher's word
    statistics, indexed by ``N_WORDS`` ...); ``code_points``: uint32[len(text)].
    """

    __slots__ = ("chunk_word", "word_hash", "word_len", "word_kind", "totals", "code_points",
                 "lines")

    def __init__(self, chunk_word, word_hash, word_len, word_kind, totals,
                 code_points) -> None:
        self.chunk_word, self.word_hash, self.word_len = chunk_word, word_hash, word_len
        self.word_kind, self.totals, self.code_points = word_kind, totals, code_points
        self.lines: tuple[np.ndarray, ...] | None = None  # line_table, once computed

    def sentences(self, chunk_starts: np.ndarray, chunk_ends: np.ndarray) -> int:
        """Total of :func:`~.words.count_sentences` over lines: line ``j`` is the words of
        chunks ``chunk_starts[j]:chunk_ends[j]`` (int64 arrays)."""
        return int(_count_sentences(self.word_kind, self.chunk_word, chunk_starts,
                                    chunk_ends))

    def stop_word_count(self, stop_hashes: np.ndarray) -> int:
        """Distinct words among ``stop_hashes`` (sorted int64 hashes, :func:`hashes_of`)."""
        return int(_distinct_hits(self.word_hash, stop_hashes))


_TEXTS: dict[int, tuple[str, TextWords]] = {}
# texts made of another's chunks, analysed when first asked for: (text, analysis of the
# other, chunk starts, chunk ends) by id
_JOINED: dict[int, tuple[str, TextWords, np.ndarray, np.ndarray]] = {}
_CACHED_WORDS = [0]
_CHUNK_LENGTHS: dict[str, tuple[int, ...]] = {}


def code_points(text: str) -> np.ndarray:
    """uint32[len(text)] code points of ``text`` (lone surrogates kept as they are)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


def _complex_lengths(text: str, starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Word counts then word lengths, chunk after chunk, of the chunks ``text[a:b]`` that
    the Python splitter splits (cached per distinct chunk)."""
    cache = _CHUNK_LENGTHS
    if len(cache) > MAX_CHUNK_CACHE:
        cache.clear()
    out: list[int] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        chunk = text[a:b]
        lens = cache.get(chunk)
        if lens is None:
            words = split_chunk(chunk)
            lens = cache[chunk] = (len(words), *map(len, words))
        out += lens
    return out


def split_text(text: str) -> TextWords:
    """The words of ``text`` as arrays (:class:`TextWords`), not cached."""
    cp = code_points(text)
    if len(cp) and cp.max() >= 0x10000:
        _fill_flags(cp)
    starts, ends, n_words, word_ends = _scan_chunks(cp, FLAGS, _ABBREV_HASHES, _UNIT_HASHES)
    hard = np.flatnonzero(n_words < 0)
    lengths = np.array(_complex_lengths(text, starts[hard], ends[hard]) if len(hard) else [],
                       np.int64)
    return TextWords(*_words(cp, FLAGS, starts, n_words, word_ends, lengths), cp)


def analyze(text: str) -> TextWords:
    """:func:`split_text` of ``text``, cached per text object (until :func:`release`)."""
    hit = _TEXTS.get(id(text))
    if hit is not None and hit[0] is text:
        return hit[1]
    joined = _JOINED.pop(id(text), None)
    if joined is not None and joined[0] is text:
        return _remember(text, _joined(*joined))
    return _remember(text, split_text(text))


def _remember(text: str, tw: TextWords) -> TextWords:
    if _CACHED_WORDS[0] + len(tw.word_len) > MAX_CACHED_WORDS:
        release()
    _TEXTS[id(text)] = (text, tw)
    _CACHED_WORDS[0] += len(tw.word_len)
    return tw


def remember_joined(text: str, tw: TextWords, chunk_starts: np.ndarray,
                    chunk_ends: np.ndarray) -> None:
    """Let :func:`analyze` give the analysis of ``text`` without splitting it: ``text``
    is the chunks ``chunk_starts[j]:chunk_ends[j]`` (int64 arrays, in order) of the text
    ``tw`` was made from, joined by whitespace (a chunk's words do not depend on its
    neighbours); built from ``tw``'s arrays when first asked for."""
    if len(_JOINED) >= MAX_JOINED:  # never asked for: let them go
        _JOINED.clear()
    _JOINED[id(text)] = (text, tw, chunk_starts, chunk_ends)


def _joined(text: str, tw: TextWords, chunk_starts: np.ndarray,
            chunk_ends: np.ndarray) -> TextWords:
    words, chunk_word = _gather(tw.chunk_word, chunk_starts, chunk_ends)
    kind, wlen, whash, totals = _gathered_words(tw.word_kind, tw.word_len, tw.word_hash,
                                                words)
    return TextWords(chunk_word, whash, wlen, kind, totals, code_points(text))


@numba.njit(cache=True)
def _gathered_words(kind, wlen, whash, words):
    """The per-word arrays at ``words`` and their :attr:`TextWords.totals`."""
    n = words.shape[0]
    k2, l2, h2 = np.empty(n, np.uint8), np.empty(n, np.int64), np.empty(n, np.int64)
    totals = np.zeros(4, np.int64)
    for j in range(n):
        w = words[j]
        k2[j], l2[j], h2[j] = kind[w], wlen[w], whash[w]
        totals[0] += 1
        if not kind[w] & _K_PUNCT:
            totals[1] += 1
            totals[2] += wlen[w]
        if kind[w] & _K_ALPHA:
            totals[3] += 1
    return k2, l2, h2, totals


@numba.njit(cache=True)
def _gather(chunk_word, chunk_starts, chunk_ends):
    """(int64 indices of the words of the chunk ranges, in order; int64 chunk -> first
    word of the joined ranges, as ``TextWords.chunk_word``)."""
    n_words, n_chunks = 0, 0
    for j in range(chunk_starts.shape[0]):
        n_words += chunk_word[chunk_ends[j]] - chunk_word[chunk_starts[j]]
        n_chunks += chunk_ends[j] - chunk_starts[j]
    words = np.empty(n_words, np.int64)
    out = np.empty(n_chunks + 1, np.int64)
    w, c = 0, 0
    for j in range(chunk_starts.shape[0]):
        for k in range(chunk_starts[j], chunk_ends[j]):
            out[c] = w
            c += 1
            for i in range(chunk_word[k], chunk_word[k + 1]):
                words[w] = i
                w += 1
    out[c] = w
    return words, out


def hashes_of(words) -> np.ndarray:
    """Sorted distinct int64 hashes (as :class:`TextWords` hashes words) of ``words``."""
    return np.unique(np.array([_hash(code_points(w), 0, len(w)) for w in words], np.int64))


def release() -> None:
    """Forget every cached text."""
    _TEXTS.clear()
    _JOINED.clear()
    _CACHED_WORDS[0] = 0


def reset() -> None:
    """Forget every cached text and every chunk the Python splitter split (a cold start,
    for benchmarks)."""
    release()
    _CHUNK_LENGTHS.clear()


@numba.njit(cache=True, inline="always")
def code_point_hash(cp, a, b):
    """int64 hash of the code points ``cp[a:b]`` (FNV-1a, then a murmur finalizer)."""
    return _hash(cp, a, b)


@numba.njit(cache=True, inline="always")
def _hash(cp, a, b):
    h = np.uint64(0xCBF29CE484222325)
    for i in range(a, b):
        h = (h ^ np.uint64(cp[i])) * np.uint64(0x100000001B3)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return np.int64(h)


@numba.njit(cache=True, inline="always")
def _all(cp, flags, a, b, bit):
    for i in range(a, b):
        if not flags[cp[i]] & bit:
            return False
    return True


@numba.njit(cache=True, inline="always")
def _maybe_cannot(cp, flags, a, b):
    """Whether ``cp[a:b].lower()`` may be "cannot" (a non-ASCII letter that lower-cases
    to ASCII: maybe)."""
    if b - a != 6:
        return False
    for i in range(6):
        c = cp[a + i]
        if c >= 128:
            return (flags[c] & LOWER_ASCII) != 0
        if c >= 65 and c <= 90:
            c += 32
        if c != _CANNOT[i]:
            return False
    return True


@numba.njit(cache=True, inline="always")
def _lower_like(f):
    return (f & ALPHA and not f & UPPER and not f & TITLE) or f & MARK


@numba.njit(cache=True)
def _is_abbreviation(cp, a, b, abbrev_hashes):
    i = np.searchsorted(abbrev_hashes, _hash(cp, a, b))
    return i < abbrev_hashes.shape[0] and abbrev_hashes[i] == _hash(cp, a, b)


@numba.njit(cache=True)
def _split_kernel(cp, flags, a, b, abbrev_hashes, unit_hashes, ends):
    """The words of the chunk ``cp[a:b]`` as :func:`~.words.split_chunk` splits it, for
    the chunks of a few shapes: one character, letters only or digits only (one word),
    letters and a final period (not an abbreviation; split off as ``_period_suffix``
    does), and ``P* core S* [.]``: one-character prefixes ``P`` (no apostrophe, so no
    clitic is in play) and suffixes ``S`` (apostrophes too), a core of ASCII digit runs
    joined by single ``. , : /`` (one word: no infix rule splits between digits there),
    or a core :func:`_mixed_core` splits (letters and digits joined by hyphens, a unit
    after a number, a contraction), and a final period split off as ``_period_suffix``
    does. Writes the words' end offsets to ``ends``; returns their number, or -1 for any
    other chunk (the Python splitter decides)."""
    if _all(cp, flags, a, b, ALPHA) or _all(cp, flags, a, b, DIGIT):
        if _maybe_cannot(cp, flags, a, b):
            return -1
        ends[0] = b
        return 1
    if cp[b - 1] == 46 and b - a >= 2 and _all(cp, flags, a, b - 1, ALPHA):
        if _maybe_cannot(cp, flags, a, b - 1) or _is_abbreviation(cp, a, b, abbrev_hashes):
            return -1
        if not _period_ok(cp, flags, a, b - 1):  # "H." "AbC.": the period stays
            ends[0] = b
            return 1
        ends[0], ends[1] = b - 1, b
        return 2
    if b - a == 1:  # one character: no rule splits it
        ends[0] = b
        return 1
    i, m = a, 0
    while i < b and flags[cp[i]] & PREFIX:
        i += 1
        ends[m] = i
        m += 1
    core = i
    n_digit = _digit_core(cp, i, b)
    if n_digit > 0:  # digit runs joined by single ". , : /" ("58.19", "10:30"): one word
        i += n_digit
        ends[m] = i
        m += 1
        core_end = i
    else:
        m = _mixed_core(cp, flags, core, b, abbrev_hashes, unit_hashes, ends, m)
        if m < 0:
            return -1
        core_end = ends[m - 1]
        i = core_end
    while i < b and (flags[cp[i]] & SUFFIX or cp[i] == 39 or cp[i] == 0x2019):
        i += 1
        ends[m] = i
        m += 1
    if i == b - 1 and cp[i] == 46:
        if i == core_end and (not _period_ok(cp, flags, core, core_end)
                              or _is_abbreviation(cp, core, b, abbrev_hashes)):
            return -1
        i += 1
        ends[m] = i
        m += 1
    return m if i == b else -1


@numba.njit(cache=True, inline="always")
def _ascii_digit(c):
    return c >= 48 and c <= 57


@numba.njit(cache=True)
def _digit_core(cp, i, b):
    """Length of the ASCII digit runs joined by single ``. , : /`` at ``cp[i:b]``, if there
    is a separator among them (one word: no infix rule splits between digits there), else
    0."""
    j = i
    seps = 0
    while j < b and _ascii_digit(cp[j]):
        j += 1
        if j + 1 < b and (cp[j] == 46 or cp[j] == 44 or cp[j] == 58 or cp[j] == 47) \
                and _ascii_digit(cp[j + 1]):
            j += 1
            seps += 1
    return j - i if seps else 0


@numba.njit(cache=True)
def _period_ok(cp, flags, core, end):
    """Whether a period right after the core ``cp[core:end]`` is split off
    (``words._period_suffix``): after a digit, a lower-case or uncased letter, or two
    upper-case letters."""
    f = flags[cp[end - 1]]
    if f & DIGIT or _lower_like(f):
        return True
    return end - core >= 2 and f & UPPER and flags[cp[end - 2]] & UPPER


@numba.njit(cache=True)
def _mixed_core(cp, flags, i, b, abbrev_hashes, unit_hashes, ends, m):
    """The words of the core at ``cp[i:]`` written to ``ends[m:]``: either letters, an
    apostrophe and letters (``don't`` → ``do n't``, ``I'm`` → ``I 'm``, ``it's`` → ``it
    's``, else one word), or runs of letters and ASCII digits joined by single hyphens,
    split at a hyphen unless a letter precedes it and a digit follows (``50-59`` →
    ``50 - 59``, ``COVID-19`` one word), a unit after a digit split off (``16GB`` → ``16
    GB``). Returns the new word count, or -1 for any other core."""
    j = i
    letters = True
    while j < b:
        f = flags[cp[j]]
        if f & ALPHA or _ascii_digit(cp[j]):
            letters = letters and (f & ALPHA) != 0
            j += 1
        elif cp[j] == 45 and j > i and j + 1 < b and (
                flags[cp[j + 1]] & ALPHA or _ascii_digit(cp[j + 1])):
            letters = False
            j += 1
        else:
            break
    if j == i or _is_abbreviation(cp, i, j, abbrev_hashes):
        return -1
    if letters and j + 1 < b and (cp[j] == 39 or cp[j] == 0x2019) \
            and flags[cp[j + 1]] & ALPHA:
        return _contraction(cp, flags, i, j, b, abbrev_hashes, ends, m)
    unit = j
    for p in range(i + 1, j):
        if _ascii_digit(cp[p - 1]) and j - p <= 4 and _is_abbreviation(cp, p, j, unit_hashes):
            unit = p
            break
    if unit - i == 6 and _maybe_cannot(cp, flags, i, unit):
        return -1
    for k in range(i + 1, unit - 1):
        if cp[k] == 45 and (flags[cp[k + 1]] & ALPHA or _ascii_digit(cp[k - 1])):
            ends[m] = k
            ends[m + 1] = k + 1
            m += 2
    ends[m] = unit
    m += 1
    if unit < j:
        ends[m] = j
        m += 1
    return m


@numba.njit(cache=True)
def _contraction(cp, flags, i, j, b, abbrev_hashes, ends, m):
    """Letters ``cp[i:j]``, an apostrophe at ``j``, letters after it (to ``b`` or a
    suffix mark): split as :func:`~.words.split_chunk` splits a clitic."""
    e = j + 1
    while e < b and flags[cp[e]] & ALPHA:
        e += 1
    if _is_abbreviation(cp, i, e, abbrev_hashes):
        return -1
    for k in range(j + 1, e):
        if cp[k] >= 128:
            return -1
    tail = e - j - 1
    t0 = cp[j + 1] | 32
    t1 = cp[j + 2] | 32 if tail >= 2 else 0
    if tail == 1 and cp[j + 1] == 115 or cp[j + 1] == 83 and tail == 1:  # 's: a suffix
        if j - i == 6 and _maybe_cannot(cp, flags, i, j):
            return -1
        cut = j
    elif (tail == 1 and (t0 == 109 or t0 == 100)) or (tail == 2 and (
            (t0 == 114 and t1 == 101) or (t0 == 118 and t1 == 101)
            or (t0 == 108 and t1 == 108))):  # 'm 'd 're 've 'll
        cut = j
    elif tail == 1 and t0 == 116 and j - i >= 2 and (cp[j - 1] == 110 or cp[j - 1] == 78):
        cut = j - 1  # n't
    else:
        cut = e  # one word
    if cut < e:
        ends[m] = cut
        m += 1
    ends[m] = e
    return m + 1


@numba.njit(cache=True)
def _scan_chunks(cp, flags, abbrev_hashes, unit_hashes):
    """Whitespace chunks of ``cp`` (``str.split()``): int64 starts, ends, words per
    chunk (-1: for the Python splitter), and the end offsets of the words of the others,
    chunk after chunk."""
    n = cp.shape[0]
    starts = np.empty(n // 2 + 1, np.int64)
    ends = np.empty(n // 2 + 1, np.int64)
    k = 0
    i = 0
    while i < n:
        while i < n and flags[cp[i]] & SPACE:
            i += 1
        if i == n:
            break
        a = i
        while i < n and not flags[cp[i]] & SPACE:
            i += 1
        starts[k] = a
        ends[k] = i
        k += 1
    nw = np.empty(k, np.int64)
    word_ends = np.empty(n + 1, np.int64)
    w = 0
    for j in range(k):
        m = _split_kernel(cp, flags, starts[j], ends[j], abbrev_hashes, unit_hashes,
                          word_ends[w:])
        nw[j] = m
        if m > 0:
            w += m
    return starts[:k], ends[:k], nw, word_ends[:w]


@numba.njit(cache=True, inline="always")
def _word_kind(cp, flags, a, b):
    """Kind bits of the word ``cp[a:b]``: punctuation (not alphanumeric at its start, all
    punctuation), holding a letter, one sentence terminal."""
    kind = 0
    punct = not flags[cp[a]] & ALNUM
    for i in range(a, b):
        f = flags[cp[i]]
        if not f & PUNCT:
            punct = False
        if f & ALPHA:
            kind |= _K_ALPHA
    if punct:
        kind |= _K_PUNCT
    if b - a == 1 and flags[cp[a]] & STERM:
        kind |= _K_STERM
    return kind


@numba.njit(cache=True)
def _words(cp, flags, starts, n_words, word_ends, lengths):
    """Per-word arrays of the chunks (``word_ends``: the kernel's word ends;
    ``lengths``: for each chunk with ``n_words`` -1, in order, its word count then its
    word lengths)."""
    k = starts.shape[0]
    total = 0
    p = 0
    for j in range(k):
        if n_words[j] < 0:
            total += lengths[p]
            p += lengths[p] + 1
        else:
            total += n_words[j]
    chunk_word = np.empty(k + 1, np.int64)
    whash = np.empty(total, np.int64)
    wlen = np.empty(total, np.int64)
    kind = np.empty(total, np.uint8)
    totals = np.zeros(4, np.int64)
    w = 0
    p = 0
    r = 0
    for j in range(k):
        chunk_word[j] = w
        a = starts[j]
        m = n_words[j]
        if m < 0:
            m = lengths[p]
            p += 1
        for _ in range(m):
            if n_words[j] < 0:
                e = a + lengths[p]
                p += 1
            else:
                e = word_ends[r]
                r += 1
            whash[w] = _hash(cp, a, e)
            wlen[w] = e - a
            kd = _word_kind(cp, flags, a, e)
            kind[w] = kd
            totals[0] += 1
            if not kd & _K_PUNCT:
                totals[1] += 1
                totals[2] += e - a
            if kd & _K_ALPHA:
                totals[3] += 1
            w += 1
            a = e
    chunk_word[k] = w
    return chunk_word, whash, wlen, kind, totals


def line_table(tw: TextWords) -> tuple[np.ndarray, ...]:
    """The lines of the text (``str.splitlines()``, each ``strip()``-ed) as int64 arrays:
    (start, end) code point offsets of the stripped line, its whitespace chunks, its
    longest chunk's length, and bits: 1 where it ends in one of ``. ? ! " '`` and not in
    ``...`` (C4's terminal punctuation), 2 where it holds ``[``, 4 where it starts with
    ``•`` or ``-``, 8 where it ends in ``...`` or ``…`` (Gopher's bullets and ellipses).
    Computed once per analysis.
    """
    if tw.lines is None:
        tw.lines = _line_table(tw.code_points, FLAGS)
    return tw.lines


#: bits of :func:`line_table`'s last array
LINE_TERMINAL, LINE_BRACKET, LINE_BULLET, LINE_ELLIPSIS = 1, 2, 4, 8


@numba.njit(cache=True)
def _is_line_break(c, nxt):
    """0: not a line boundary of ``str.splitlines``; else the code points it takes."""
    if c == 13:
        return 2 if nxt == 10 else 1
    if c == 10 or c == 11 or c == 12 or c == 28 or c == 29 or c == 30 or c == 0x85 \
            or c == 0x2028 or c == 0x2029:
        return 1
    return 0


@numba.njit(cache=True)
def _line_table(cp, flags):
    n = cp.shape[0]
    cap = 1
    for i in range(n):
        if _is_line_break(cp[i], 0):
            cap += 1
    starts = np.empty(cap, np.int64)
    ends = np.empty(cap, np.int64)
    chunks = np.zeros(cap, np.int64)
    longest = np.zeros(cap, np.int64)
    term = np.zeros(cap, np.int64)
    k = 0
    i = 0
    while i < n:
        a = i
        br = 0
        while i < n:
            br = _is_line_break(cp[i], cp[i + 1] if i + 1 < n else 0)
            if br:
                break
            i += 1
        b = i
        i += br
        while a < b and flags[cp[a]] & SPACE:
            a += 1
        while b > a and flags[cp[b - 1]] & SPACE:
            b -= 1
        starts[k], ends[k] = a, b
        j = a
        while j < b:
            while j < b and flags[cp[j]] & SPACE:
                j += 1
            c0 = j
            while j < b and not flags[cp[j]] & SPACE:
                j += 1
            if j > c0:
                chunks[k] += 1
                longest[k] = max(longest[k], j - c0)
        if b > a:
            last = cp[b - 1]
            ends_term = last == 46 or last == 63 or last == 33 or last == 34 or last == 39
            dots = b - a >= 3 and cp[b - 1] == 46 and cp[b - 2] == 46 and cp[b - 3] == 46
            term[k] = (ends_term and not dots) | 4 * (cp[a] == 0x2022 or cp[a] == 45) \
                | 8 * (dots or last == 0x2026)
            for j in range(a, b):
                if cp[j] == 91:
                    term[k] |= 2
                    break
        k += 1
    return starts[:k], ends[:k], chunks[:k], longest[:k], term[:k]


@numba.njit(cache=True)
def _count_sentences(kind, chunk_word, line_starts, line_ends):
    total = 0
    for j in range(line_starts.shape[0]):
        a, b = chunk_word[line_starts[j]], chunk_word[line_ends[j]]
        if b == a:
            continue
        n = 1
        seen_end = False
        for w in range(a, b):
            if kind[w] & _K_STERM:
                seen_end = True
            elif seen_end and not kind[w] & _K_PUNCT:
                n += 1
                seen_end = False
        total += n
    return total


@numba.njit(cache=True)
def _distinct_hits(whash, stop_hashes):
    seen = np.zeros(stop_hashes.shape[0], np.bool_)
    n = 0
    for h in whash:
        i = np.searchsorted(stop_hashes, h)
        if i < stop_hashes.shape[0] and stop_hashes[i] == h and not seen[i]:
            seen[i] = True
            n += 1
    return n


# sorted hashes of the abbreviations, for the kernel to leave them to the Python splitter
_ABBREV_HASHES = hashes_of(ABBREVIATIONS)
# sorted hashes of the units split off after a number ("16GB" → "16 GB")
_UNIT_HASHES = hashes_of(UNIT_WORDS)
