"""A document split into words once, for every quality filter that reads it.

The quality filters (Gopher quality and repetition, C4, FineWeb) all need the words of
:func:`tokenmill.pipeline.document.words.split_words`, and they run one after another over
a whole block. :func:`analyze` splits a text once, in numba over its code points, into
word boundaries and per-word numbers, and caches the result per text object (the entry
holds the text, so an id is never reused while cached): the second filter to look at a
document pays one dictionary lookup.

The split follows :mod:`~tokenmill.pipeline.document.words` exactly: the text is cut into
whitespace chunks (``str.split()``), and one pass over the code points
(:func:`_scan_words`) writes the words of the chunks of the common shapes as it goes:
letters only or digits only (one word, about 80 % of the chunks of web text), letters
and one closing mark (``word,`` ``word.``, about 10 %), one character, and, through
:func:`_split_kernel`, closing and opening marks, hyphenated letters and numbers, units
after numbers, contractions. Every other chunk (about 2.5 % of the chunks of web text) is
split by :func:`~tokenmill.pipeline.document.words.split_chunk` in Python, as word
lengths (a chunk's words are its consecutive pieces), and its words are put in their
places by :func:`_splice`; the splits are remembered in arrays
(:mod:`~tokenmill.pipeline.document.chunk_memo`) that the scan looks a chunk up in before
leaving it to Python, so a chunk seen before is split in numba. Per word the kernel
keeps its start and length (code points), a 64-bit hash of its code points (FNV-1a, then
a murmur finalizer: equal words, equal hashes), whether it is punctuation
(:func:`~.words.is_punct_word`), holds a letter, or is one sentence terminal; character
classes come from a table over every code point built from ``str`` methods and
:mod:`unicodedata` (:data:`FLAGS`; the code points above the Basic Multilingual Plane are
filled in when a text first holds them).

:func:`line_table` gives the text's lines (once per analysis) with the bits the filters
check per line, among them whether a line may hold a text that C4 looks for
(``LINE_LOOK``), so that C4 reads only those lines in Python.

A filter that edits a text by keeping some of its lines (C4) hands the new text over with
:func:`remember_joined`: its analysis is then gathered from the old one's arrays when a
later filter first asks for it, not split again (:func:`word_count` does not even gather).

:func:`release` empties the per-text cache (call it when a block's document stages are
done, to free the memory early); it also empties itself past ``MAX_CACHED_WORDS`` words.
"""

from __future__ import annotations

import unicodedata

import numba
import numpy as np

from tokenmill.pipeline.document import chunk_memo, words
from tokenmill.pipeline.document.words import (
    ABBREVIATIONS,
    PREFIX_MARKS,
    SENTENCE_TERMINALS,
    SUFFIX_MARKS,
    UNIT_WORDS,
    is_punct_char,
    split_chunk,
)
from tokenmill.tablecache import cached_arrays, source_sha256

MAX_CACHED_WORDS = 8_000_000
MAX_CHUNK_CACHE = 500_000  # chunks split in Python that the chunk table has no room for
MAX_JOINED = 10_000  # texts awaiting their joined analysis (a block's, and more)

#: indices of :meth:`TextWords.totals`
N_WORDS, N_CONTENT, CONTENT_CHARS, N_ALPHA = 0, 1, 2, 3

# per code point flags
(ALPHA, DIGIT, ALNUM, PUNCT, STERM, UPPER, TITLE, MARK, SPACE, PREFIX, SUFFIX,
 LOWER_ASCII, BREAK, LOOK, SYMBOL) = (1 << i for i in range(15))
_KNOWN = 1 << 15  # the entry has been filled in
#: the lower-case ASCII words behind ``LINE_LOOK``: every text C4 looks for in a line's
#: ``lower()`` (``javascript``, ``lorem ipsum``, its policy phrases) holds one of them
LOOK_WORDS = ("javascript", "lorem ipsum", "terms of use", "policy", "cookie")
# per word of LOOK_WORDS the letter it is looked for at: one of its rarer letters, a
# different one per word (7 % of English letters; their first letters are 18 %)
_LOOK_ANCHORS = ("j", "p", "f", "y", "k")
# the code points where a line may hold what C4 looks for: an anchor (either case), "["
# (LINE_BRACKET), "{"; and not ASCII, lower-cased holding ASCII (LOWER_ASCII)
_LOOK_STARTS = frozenset("".join(a + a.upper() for a in _LOOK_ANCHORS) + "[{")

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
            | LOWER_ASCII * (c >= 128 and any(map(str.isascii, ch.lower())))
            | BREAK * (ch in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
            | LOOK * (ch in _LOOK_STARTS or c >= 128 and any(map(str.isascii, ch.lower())))
            | SYMBOL * (ch in "#.\u2026"))


#: uint16 flags per code point (``ALPHA``: ``str.isalpha``, ``DIGIT``: ``isdigit``,
#: ``ALNUM``: ``isalnum``, ``PUNCT``: :func:`~.words.is_punct_char`, ``STERM``: a
#: sentence terminal, ``UPPER``/``TITLE``: ``isupper``/``istitle``, ``MARK``: category M,
#: ``SPACE``: ``isspace``, ``PREFIX``/``SUFFIX``: one of :data:`~.words.PREFIX_MARKS` /
#: :data:`~.words.SUFFIX_MARKS`, ``LOWER_ASCII``: not ASCII, lower-cased holds ASCII,
#: ``BREAK``: a line boundary of ``str.splitlines``, ``LOOK``: where :func:`line_table`
#: looks for C4's texts, ``SYMBOL``: one of ``# . …``, which it counts); filled for the
#: BMP now, above it on first sight
FLAGS = np.zeros(0x110000, np.uint16)
FLAGS[:0x10000] = cached_arrays(  # built once per machine, loaded by every worker
    "word-flags", [unicodedata.unidata_version, source_sha256(__file__, words.__file__)],
    lambda: (np.array([_flags_of(c) for c in range(0x10000)], np.uint16),))[0]


def flags_for(cp: np.ndarray) -> np.ndarray:
    """:data:`FLAGS`, its entries for the code points of ``cp`` (uint32) filled in."""
    if len(cp) and cp.max() >= 0x10000:
        _fill_flags(cp)
    return FLAGS


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

    def stop_word_count(self, stop_hashes: np.ndarray, min_len: int = 0,
                        max_len: int = 1 << 62) -> int:
        """Distinct words among ``stop_hashes`` (sorted int64 hashes, :func:`hashes_of`);
        ``min_len``, ``max_len``: the shortest and longest of those words' lengths (code
        points; words of other lengths are not looked up)."""
        return int(_distinct_hits(self.word_hash, self.word_len, stop_hashes, min_len,
                                  max_len))


_TEXTS: dict[int, tuple[str, TextWords]] = {}
# texts made of another's chunks, analysed when first asked for: (text, analysis of the
# other, chunk starts, chunk ends) by id
_JOINED: dict[int, tuple[str, TextWords, np.ndarray, np.ndarray]] = {}
_CACHED_WORDS = [0]
# the splits of the chunks the Python splitter split, for the scan to look up
_CHUNKS = chunk_memo.new_table()
_CHUNK_LENGTHS: dict[str, tuple[int, ...]] = {}


def code_points(text: str) -> np.ndarray:
    """uint32[len(text)] code points of ``text`` (lone surrogates and NULs kept as they
    are; numpy's UCS-4 copy of the string, faster than encoding to UTF-32 for text
    beyond Latin-1)."""
    if not text:
        return np.zeros(0, np.uint32)
    return np.array(text).reshape(1).view(np.uint32)


def _complex_lengths(text: str, hard: list[list[int]]) -> list[int]:
    """Word counts then word lengths, chunk after chunk, of the chunks ``text[a:b]`` that
    the Python splitter splits (``hard``: [chunk index, a, b] each; cached per distinct
    chunk, for those the chunk table has no room for)."""
    cache = _CHUNK_LENGTHS
    if len(cache) > MAX_CHUNK_CACHE:
        cache.clear()
    out: list[int] = []
    for _, a, b in hard:
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
    chunk_word, whash, wlen, kind, totals, hard = _scan_words(cp, FLAGS, _ABBREV_HASHES,
                                                              _UNIT_HASHES, _CHUNKS)
    if len(hard):
        lengths = np.array(_complex_lengths(text, hard.tolist()), np.int64)
        chunk_memo.learn(cp, hard, _chunk_hashes(cp, hard), lengths, _CHUNKS)
        chunk_word, whash, wlen, kind = _splice(cp, FLAGS, chunk_word, whash, wlen, kind,
                                                totals, hard, lengths)
    return TextWords(chunk_word, whash, wlen, kind, totals, cp)


def analyze(text: str) -> TextWords:
    """:func:`split_text` of ``text``, cached per text object (until :func:`release`)."""
    hit = _TEXTS.get(id(text))
    if hit is not None and hit[0] is text:
        return hit[1]
    joined = _JOINED.pop(id(text), None)
    if joined is not None and joined[0] is text:
        return _remember(text, _joined(*joined))
    return _remember(text, split_text(text))


def word_count(text: str) -> int:
    """``analyze(text).totals[N_WORDS]``, without gathering the words of a text that
    :func:`remember_joined` announced (a sum over its chunk ranges)."""
    hit = _TEXTS.get(id(text))
    if hit is not None and hit[0] is text:
        return int(hit[1].totals[N_WORDS])
    joined = _JOINED.get(id(text))
    if joined is not None and joined[0] is text:
        return _span_words(joined[1].chunk_word, joined[2], joined[3])
    return int(analyze(text).totals[N_WORDS])


@numba.njit(cache=True)
def _span_words(chunk_word, chunk_starts, chunk_ends):
    """Words in the chunk ranges ``chunk_starts[j]:chunk_ends[j]``."""
    n = 0
    for j in range(chunk_starts.shape[0]):
        n += chunk_word[chunk_ends[j]] - chunk_word[chunk_starts[j]]
    return n


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
    chunk_memo.clear(_CHUNKS)
    _CHUNK_LENGTHS.clear()


@numba.njit(cache=True)
def _chunk_hashes(cp, hard):
    """int64 hashes (:func:`code_point_hash`) of the chunks ``cp[hard[q, 1]:hard[q, 2]]``."""
    keys = np.empty(hard.shape[0], np.int64)
    for q in range(hard.shape[0]):
        keys[q] = _hash(cp, hard[q, 1], hard[q, 2])
    return keys


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


@numba.njit(cache=True, inline="always")
def _is_abbreviation(cp, a, b, abbrev_hashes):
    i = np.searchsorted(abbrev_hashes, _hash(cp, a, b))
    return i < abbrev_hashes.shape[0] and abbrev_hashes[i] == _hash(cp, a, b)


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
def _period_ok(cp, flags, core, end):
    """Whether a period right after the core ``cp[core:end]`` is split off
    (``words._period_suffix``): after a digit, a lower-case or uncased letter, or two
    upper-case letters."""
    f = flags[cp[end - 1]]
    if f & DIGIT or _lower_like(f):
        return True
    return end - core >= 2 and f & UPPER and flags[cp[end - 2]] & UPPER


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
def _word_kind(cp, flags, a, b):
    """Kind bits of the word ``cp[a:b]``: punctuation (not alphanumeric at its start, all
    punctuation), holding a letter, one sentence terminal."""
    f0 = flags[cp[a]]
    f_and, f_or = 0xFFFF, 0  # the flags every code point has, that any has
    for i in range(a, b):
        f = flags[cp[i]]
        f_and &= f
        f_or |= f
    kind = 0
    if not f0 & ALNUM and f_and & PUNCT:
        kind |= _K_PUNCT
    if f_or & ALPHA:
        kind |= _K_ALPHA
    if b - a == 1 and f0 & STERM:
        kind |= _K_STERM
    return kind


@numba.njit(cache=True)
def _scan_words(cp, flags, abbrev_hashes, unit_hashes, chunks):
    """One pass over ``cp``: its whitespace chunks (``str.split()``) and the words of the
    chunks the kernel splits or finds in ``chunks`` (:mod:`.chunk_memo`), as the arrays of
    :class:`TextWords`; a chunk left to the Python splitter has no words yet (see
    :func:`_splice`). Returns (int64
    chunk -> first word, word hashes, word lengths, uint8 word kinds, int64[4] totals,
    int64[chunks left, 3]: chunk index, start, end)."""
    n = cp.shape[0]
    hard = np.empty((n // 2 + 1, 3), np.int64)
    n_hard = 0
    chunk_word = np.empty(n // 2 + 2, np.int64)
    whash = np.empty(n, np.int64)
    wlen = np.empty(n, np.int64)
    kind = np.empty(n, np.uint8)
    totals = np.zeros(4, np.int64)
    tmp = np.empty(n + 1, np.int64)
    k, w, i = 0, 0, 0
    while i < n:
        while i < n and flags[cp[i]] & SPACE:
            i += 1
        if i == n:
            break
        a = i
        h = np.uint64(0xCBF29CE484222325)
        h_body = h
        f_and, f_or, f_body = 0xFFFF, 0, 0xFFFF
        while i < n:
            c = cp[i]
            f = flags[c]
            if f & SPACE:
                break
            f_body, h_body = f_and, h
            f_and &= f
            f_or |= f
            h = (h ^ np.uint64(c)) * np.uint64(0x100000001B3)
            i += 1
        chunk_word[k] = w
        if f_and & (ALPHA | DIGIT) and not _maybe_cannot(cp, flags, a, i):
            # letters only or digits only: one word (the most common chunk)
            kd = _K_ALPHA if f_or & ALPHA else 0
            if not flags[cp[a]] & ALNUM and f_and & PUNCT:
                kd |= _K_PUNCT
            if i - a == 1 and f_and & STERM:
                kd |= _K_STERM
            whash[w], wlen[w], kind[w] = _finish(h), i - a, kd
            _count_word(kd, i - a, totals)
            w += 1
        elif i - a == 1:  # one character: no rule splits it
            w = _put_word(cp, flags, a, i, w, whash, wlen, kind, totals)
        elif f_body & ALPHA and _one_suffix(cp, flags, a, i, _finish(h), abbrev_hashes):
            # letters and one closing mark ("word," "word." "word)"): two words
            whash[w], wlen[w], kind[w] = _finish(h_body), i - 1 - a, _K_ALPHA
            totals[0] += 1
            totals[1] += 1
            totals[2] += i - 1 - a
            totals[3] += 1
            w = _put_word(cp, flags, i - 1, i, w + 1, whash, wlen, kind, totals)
        else:
            m = _split_kernel(cp, flags, a, i, abbrev_hashes, unit_hashes, tmp)
            if m < 0:
                m = chunk_memo.known_split(cp, a, i, _finish(h), chunks, tmp)
            if m < 0:
                hard[n_hard, 0], hard[n_hard, 1], hard[n_hard, 2] = k, a, i
                n_hard += 1
            e0 = a
            for t in range(m):
                e = tmp[t]
                w = _put_word(cp, flags, e0, e, w, whash, wlen, kind, totals)
                e0 = e
        k += 1
    chunk_word[k] = w
    return (chunk_word[:k + 1].copy(), whash[:w].copy(), wlen[:w].copy(), kind[:w].copy(),
            totals, hard[:n_hard].copy())


@numba.njit(cache=True, inline="always")
def _one_suffix(cp, flags, a, b, chunk_hash, abbrev_hashes):
    """Whether the chunk ``cp[a:b]`` of letters then one other character splits into
    those two words (``words._split_chunk``'s first shortcut): the letters are not
    "cannot", the last is one of ``, ; : ! ? ) "``, or a period after a lower-case or
    uncased letter in a chunk that is not an abbreviation (``chunk_hash``: its hash)."""
    last = cp[b - 1]
    if last == 46:
        if not _lower_like(flags[cp[b - 2]]) or _in_sorted(abbrev_hashes, chunk_hash):
            return False
    elif not (last == 44 or last == 59 or last == 58 or last == 33 or last == 63
              or last == 41 or last == 34):
        return False
    return not _maybe_cannot(cp, flags, a, b - 1)


@numba.njit(cache=True, inline="always")
def _in_sorted(hashes, h):
    """Whether ``h`` is in the sorted int64 array ``hashes``."""
    i = np.searchsorted(hashes, h)
    return i < hashes.shape[0] and hashes[i] == h


@numba.njit(cache=True, inline="always")
def _finish(h):
    """The murmur finalizer of :func:`_hash` on an FNV-1a state ``h`` (uint64)."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return np.int64(h)


@numba.njit(cache=True, inline="always")
def _put_word(cp, flags, a, e, w, whash, wlen, kind, totals):
    """Write the word ``cp[a:e]`` at index ``w`` of the word arrays, count it in
    ``totals``; returns ``w + 1``."""
    kd = _word_kind(cp, flags, a, e)
    whash[w], wlen[w], kind[w] = _hash(cp, a, e), e - a, kd
    _count_word(kd, e - a, totals)
    return w + 1


@numba.njit(cache=True, inline="always")
def _count_word(kd, n, totals):
    """Count a word of kind ``kd`` and ``n`` code points in ``totals`` (words, words
    that are not punctuation and their code points, alphabetic words)."""
    totals[0] += 1
    if not kd & _K_PUNCT:
        totals[1] += 1
        totals[2] += n
    if kd & _K_ALPHA:
        totals[3] += 1


@numba.njit(cache=True)
def _splice(cp, flags, chunk_word, whash, wlen, kind, totals, hard, lengths):
    """The word arrays of :func:`_scan_words` with the words of the chunks it left to
    Python (``hard``: chunk index, start, end) put in their places (``lengths``: for each
    of them, in order, its word count then its word lengths); ``totals`` gets their
    counts."""
    k = chunk_word.shape[0] - 1
    total = whash.shape[0]
    p = 0
    for _ in range(hard.shape[0]):
        total += lengths[p]
        p += lengths[p] + 1
    cw = np.empty(k + 1, np.int64)
    h2 = np.empty(total, np.int64)
    l2 = np.empty(total, np.int64)
    k2 = np.empty(total, np.uint8)
    w, p, q = 0, 0, 0
    for j in range(k):
        cw[j] = w
        if q < hard.shape[0] and hard[q, 0] == j:
            a = hard[q, 1]
            m = lengths[p]
            for t in range(m):
                e = a + lengths[p + 1 + t]
                w = _put_word(cp, flags, a, e, w, h2, l2, k2, totals)
                a = e
            p += m + 1
            q += 1
        else:
            for r in range(chunk_word[j], chunk_word[j + 1]):
                h2[w], l2[w], k2[w] = whash[r], wlen[r], kind[r]
                w += 1
    cw[k] = w
    return cw, h2, l2, k2


def line_table(tw: TextWords) -> tuple[np.ndarray, ...]:
    """The lines of the text (``str.splitlines()``, each ``strip()``-ed) as int64 arrays:
    (start, end) code point offsets of the stripped line, its whitespace chunks, its
    longest chunk's length, and bits: 1 where it ends in one of ``. ? ! " '`` and not in
    ``...`` (C4's terminal punctuation), 2 where it holds ``[``, 4 where it starts with
    ``•`` or ``-``, 8 where it ends in ``...`` or ``…`` (Gopher's bullets and ellipses),
    16 where its ``lower()`` may hold ``{`` or one of :data:`LOOK_WORDS` (it holds one
    of them with ASCII letters of any case, or a character whose ``lower()`` holds an
    ASCII one: lines without the bit hold none); and int64[5] counts over the text: ``#``,
    ``...`` (as ``str.count`` counts it), ``…``, lines with bit 4, lines with bit 8.
    Computed once per analysis.
    """
    if tw.lines is None:
        tw.lines = _line_table(tw.code_points, FLAGS)
    return tw.lines


#: bits of :func:`line_table`'s last array
LINE_TERMINAL, LINE_BRACKET, LINE_BULLET, LINE_ELLIPSIS, LINE_LOOK = 1, 2, 4, 8, 16
_LOOK_CP = np.array([ord(c) for w in LOOK_WORDS for c in w], np.int64)
_LOOK_AT = np.cumsum([0] + [len(w) for w in LOOK_WORDS]).astype(np.int64)
# per word, its anchor's offset in it
_LOOK_OFFSET = np.array([w.index(a) for w, a in zip(LOOK_WORDS, _LOOK_ANCHORS, strict=True)],
                        np.int64)
# per ASCII code point: 1 + the index in LOOK_WORDS of the word it is the anchor of
# (either case), -1 for "[" (LINE_BRACKET), -2 for "{", else 0
_ASCII_LOOK = np.zeros(128, np.int64)
for _k, _a in enumerate(_LOOK_ANCHORS):
    _ASCII_LOOK[ord(_a)] = _ASCII_LOOK[ord(_a.upper())] = _k + 1
_ASCII_LOOK[ord("[")], _ASCII_LOOK[ord("{")] = -1, -2


@numba.njit(cache=True, inline="always")
def _folded(c):
    """An ASCII upper-case letter's lower case; any other code point as it is."""
    return c + 32 if c >= 65 and c <= 90 else c


@numba.njit(cache=True, inline="always")
def _look_word_at(cp, j, b, k):
    """Whether word ``k`` of :data:`LOOK_WORDS` is at ``cp[j:b]``'s start (ASCII case
    folded; ``j`` may be negative: no)."""
    s, e = _LOOK_AT[k], _LOOK_AT[k + 1]
    if j < 0 or e - s > b - j:
        return False
    for t in range(e - s):
        if _folded(cp[j + t]) != _LOOK_CP[s + t]:
            return False
    return True


@numba.njit(cache=True, inline="always")
def _look_bits(cp, j, n, c):
    """The ``LINE_BRACKET`` / ``LINE_LOOK`` bits for the code point ``c = cp[j]`` (``LOOK``
    in :data:`FLAGS`) of a text of ``n`` code points: for an anchor, whether its word of
    :data:`LOOK_WORDS` is around it. A word that holds a line's code point lies on that
    line (its letters and spaces match no line boundary, and no stripped space before
    the line's first letter), so it is looked for in the whole text, not the line."""
    if c >= 128:
        return 16
    v = _ASCII_LOOK[c]
    if v == -1:
        return 2
    if v == -2 or (v > 0 and _look_word_at(cp, j - _LOOK_OFFSET[v - 1], n, v - 1)):
        return 16
    return 0


@numba.njit(cache=True, inline="always")
def _end_bits(cp, a, b):
    """The ``LINE_TERMINAL``, ``LINE_BULLET`` and ``LINE_ELLIPSIS`` bits of the stripped,
    non-empty line ``cp[a:b]``."""
    last = cp[b - 1]
    ends_term = last == 46 or last == 63 or last == 33 or last == 34 or last == 39
    dots = b - a >= 3 and cp[b - 1] == 46 and cp[b - 2] == 46 and cp[b - 3] == 46
    return (ends_term and not dots) | 4 * (cp[a] == 0x2022 or cp[a] == 45) \
        | 8 * (dots or last == 0x2026)


@numba.njit(cache=True, inline="always")
def _count_symbol(cp, i, c, counts):
    """Count the ``SYMBOL`` code point ``c = cp[i]`` in ``counts`` (``#``, ``...``, ``…``):
    a run of periods counts once, at its start, as ``str.count("...")`` counts it."""
    if c == 35:
        counts[0] += 1
    elif c == 0x2026:
        counts[2] += 1
    elif i == 0 or cp[i - 1] != 46:
        j = i + 1
        while j < cp.shape[0] and cp[j] == 46:
            j += 1
        counts[1] += (j - i) // 3


@numba.njit(cache=True)
def _line_table(cp, flags):
    """:func:`line_table`'s arrays in one pass over ``cp`` (``flags``: :data:`FLAGS`)."""
    n = cp.shape[0]
    counts = np.zeros(5, np.int64)
    starts = np.empty(n + 1, np.int64)
    ends = np.empty(n + 1, np.int64)
    chunks = np.empty(n + 1, np.int64)
    longest = np.empty(n + 1, np.int64)
    term = np.empty(n + 1, np.int64)
    k = 0
    i = 0
    while i < n:
        n_chunks, most, look = 0, 0, 0
        a, b = i, -1  # b: the end of the last chunk seen
        c0 = -1  # the start of the chunk in progress
        br = 0
        while i < n:
            c = cp[i]
            f = flags[c]
            if f & SPACE:
                if c0 >= 0:
                    n_chunks += 1
                    most = max(most, i - c0)
                    b, c0 = i, -1
                if f & BREAK:
                    br = 2 if c == 13 and i + 1 < n and cp[i + 1] == 10 else 1
                    break
            else:
                if c0 < 0:
                    if b < 0:
                        a = i
                    c0 = i
                if f & LOOK:
                    look |= _look_bits(cp, i, n, c)
                elif f & SYMBOL:
                    _count_symbol(cp, i, c, counts)
            i += 1
        if c0 >= 0:
            n_chunks += 1
            most = max(most, i - c0)
            b = i
        chunks[k], longest[k] = n_chunks, most
        if b < 0:  # a blank line: stripped to nothing at its end
            starts[k], ends[k], term[k] = i, i, 0
        else:
            starts[k], ends[k] = a, b
            term[k] = _end_bits(cp, a, b) | look
            counts[3] += (term[k] & 4) != 0
            counts[4] += (term[k] & 8) != 0
        i += br
        k += 1
    return (starts[:k].copy(), ends[:k].copy(), chunks[:k].copy(), longest[:k].copy(),
            term[:k].copy(), counts)


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
def _distinct_hits(whash, wlen, stop_hashes, min_len, max_len):
    """Distinct words among ``stop_hashes`` (see :meth:`TextWords.stop_word_count`); a
    word whose hash's low 6 bits no stop word has is not looked up."""
    seen = np.zeros(stop_hashes.shape[0], np.bool_)
    low_bits = np.uint64(0)  # bit b: some stop word's hash ends in b
    for h in stop_hashes:
        low_bits |= np.uint64(1) << np.uint64(h & 63)
    n = 0
    for j in range(whash.shape[0]):
        if wlen[j] < min_len or wlen[j] > max_len:
            continue
        h = whash[j]
        if not (low_bits >> np.uint64(h & 63)) & np.uint64(1):
            continue
        i = np.searchsorted(stop_hashes, h)
        if i < stop_hashes.shape[0] and stop_hashes[i] == h and not seen[i]:
            seen[i] = True
            n += 1
    return n


# sorted hashes of the abbreviations, for the kernel to leave them to the Python splitter
_ABBREV_HASHES = hashes_of(ABBREVIATIONS)
# sorted hashes of the units split off after a number ("16GB" → "16 GB")
_UNIT_HASHES = hashes_of(UNIT_WORDS)
