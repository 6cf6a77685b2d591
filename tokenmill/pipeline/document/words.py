"""Word and sentence splitting for the quality filters, following spaCy's English rules.

The Gopher, C4 and FineWeb filters were tuned on words and sentences from a tokenizer;
datatrove (the FineWeb reference implementation) uses spaCy's rule-based English
tokenizer (``spacy.blank("en")``) and its ``sentencizer``. This module re-implements the
same kind of rules (Honnibal & Montani, spaCy 3, "Tokenizer exceptions" and
``lang/punctuation.py``) in plain Python, without spaCy:

1. Text is split at whitespace into chunks.
2. A chunk loses, one at a time, leading *prefixes* (punctuation, quotes, currency signs,
   symbols) and trailing *suffixes* (punctuation, quotes, ``'s``, a unit or currency after a
   number, a period after a digit, lower-case letter or punctuation, or after two
   upper-case letters), until it is a special case (``Mr.``, ``e.g.``, ``U.S.`` stay
   whole), a URL, or has no affix left.
3. What remains is split at *infixes*: ellipses, hyphens and dashes between letters, a
   comma between letters, ``: < > = /`` between a letter or digit and a letter, a period
   between a lower-case and an upper-case letter, ``+ - * ^`` between digits; and English
   contractions are split (``don't`` → ``do n't``, ``I'm`` → ``I 'm``).

So ``58.19``, ``1,000``, ``10:30`` and ``U.S.`` are one word each, and ``(word),`` is three.
Chunks repeat (Zipf), so their splits are cached.

Sentences (:func:`count_sentences`) follow spaCy's sentencizer: a sentence ends at a word
that is one sentence-terminal character (Unicode ``Sentence_Terminal``, e.g. ``. ! ?``)
and the next sentence starts at the next word that is not punctuation.
"""

from __future__ import annotations

import itertools
import operator
import re
import unicodedata
from collections import Counter

# Unicode 16 PropList.txt, Sentence_Terminal: the sentence-ending marks of every script
# (". ! ?", Arabic "؟", Devanagari danda "।", CJK "。", fullwidth "！？", ...), as ranges.
_STERM_RANGES = (
    (0x21, 0x21), (0x2E, 0x2E), (0x3F, 0x3F), (0x589, 0x589), (0x61D, 0x61F),
    (0x6D4, 0x6D4), (0x700, 0x702), (0x7F9, 0x7F9), (0x837, 0x837), (0x839, 0x839),
    (0x83D, 0x83E), (0x964, 0x965), (0x104A, 0x104B), (0x1362, 0x1362), (0x1367, 0x1368),
    (0x166E, 0x166E), (0x1735, 0x1736), (0x17D4, 0x17D5), (0x1803, 0x1803),
    (0x1809, 0x1809), (0x1944, 0x1945), (0x1AA8, 0x1AAB), (0x1B4E, 0x1B4F),
    (0x1B5A, 0x1B5B), (0x1B5E, 0x1B5F), (0x1B7D, 0x1B7F), (0x1C3B, 0x1C3C),
    (0x1C7E, 0x1C7F), (0x2024, 0x2024), (0x203C, 0x203D), (0x2047, 0x2049),
    (0x2CF9, 0x2CFB), (0x2E2E, 0x2E2E), (0x2E3C, 0x2E3C), (0x2E53, 0x2E54),
    (0x2E60, 0x2E61), (0x3002, 0x3002), (0xA4FF, 0xA4FF), (0xA60E, 0xA60F),
    (0xA6F3, 0xA6F3), (0xA6F7, 0xA6F7), (0xA876, 0xA877), (0xA8CE, 0xA8CF),
    (0xA92F, 0xA92F), (0xA9C8, 0xA9C9), (0xAA5D, 0xAA5F), (0xAAF0, 0xAAF1),
    (0xABEB, 0xABEB), (0xFE12, 0xFE12), (0xFE15, 0xFE16), (0xFE52, 0xFE52),
    (0xFE56, 0xFE57), (0xFF01, 0xFF01), (0xFF0E, 0xFF0E), (0xFF1F, 0xFF1F),
    (0xFF61, 0xFF61), (0x10A56, 0x10A57), (0x10F55, 0x10F59), (0x10F86, 0x10F89),
    (0x11047, 0x11048), (0x110BE, 0x110C1), (0x11141, 0x11143), (0x111C5, 0x111C6),
    (0x111CD, 0x111CD), (0x111DE, 0x111DF), (0x11238, 0x11239), (0x1123B, 0x1123C),
    (0x112A9, 0x112A9), (0x113D4, 0x113D5), (0x1144B, 0x1144C), (0x115C2, 0x115C3),
    (0x115C9, 0x115D7), (0x11641, 0x11642), (0x1173C, 0x1173E), (0x11944, 0x11944),
    (0x11946, 0x11946), (0x11A42, 0x11A43), (0x11A9B, 0x11A9C), (0x11C41, 0x11C42),
    (0x11EF7, 0x11EF8), (0x11F43, 0x11F44), (0x16A6E, 0x16A6F), (0x16AF5, 0x16AF5),
    (0x16B37, 0x16B38), (0x16B44, 0x16B44), (0x16D6E, 0x16D6F), (0x16E98, 0x16E98),
    (0x1BC9F, 0x1BC9F), (0x1DA88, 0x1DA88),
)
SENTENCE_TERMINALS: frozenset[str] = frozenset(
    chr(c) for lo, hi in _STERM_RANGES for c in range(lo, hi + 1))

_ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def is_punct_char(ch: str) -> bool:
    """ASCII punctuation, any Unicode punctuation (category P*), or a sentence terminal."""
    return ch in _ASCII_PUNCT or unicodedata.category(ch)[0] == "P" or ch in SENTENCE_TERMINALS


def is_punct_word(word: str) -> bool:
    """Whether every character of ``word`` is punctuation (:func:`is_punct_char`)."""
    return not word[:1].isalnum() and all(is_punct_char(ch) for ch in word)




_L = r"[^\W\d_]"  # a letter (any script)
_QUOTES = "'\"”“`‘´’‚„»«「」『』（）〔〕【】《》〈〉⟦⟧"
_PUNCT = "…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪"
_CURRENCY = "$£€¥฿₽﷼₴₠₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₵₶₷₸₹₺₻₼₾₿"
_UNITS = ("km|km²|km³|m|m²|m³|dm|dm²|dm³|cm|cm²|cm³|mm|mm²|mm³|ha|µm|nm|yd|in|ft|kg|g|mg|µg|"
          "t|lb|oz|m/s|km/h|kmh|mph|hPa|Pa|mbar|mb|MB|kb|KB|gb|GB|tb|TB|T|G|M|K|%|°C|°F|°K|"
          "am|pm|a\\.m\\.|p\\.m\\.")


def _cls(chars: str) -> str:
    return "[" + re.escape(chars) + "]"


def _is_symbol(ch: str) -> bool:
    return unicodedata.category(ch) == "So"


def _lower_like(ch: str) -> bool:
    """A lower-case letter, a letter of a script without case, or a combining mark."""
    return (ch.isalpha() and not ch.isupper() and not ch.istitle()) or \
        unicodedata.category(ch)[0] == "M"


def _period_suffix(s: str) -> bool:
    """Whether the final ``.`` of ``s`` is split off: after a digit, a lower-case or
    uncased letter, ``% ² - +`` or punctuation, or after two upper-case letters."""
    if len(s) < 2 or s[-1] != ".":
        return False
    p = s[-2]
    return (p.isdigit() or _lower_like(p) or p in "%²-+" or p in _PUNCT or p in _QUOTES
            or (len(s) > 2 and p.isupper() and s[-3].isupper()))


_PREFIX_RE = re.compile(
    r"(?:\.\.+|…|§|%|=|—|–|\+(?![0-9])|US\$|C\$|A\$|" + _cls(_PUNCT + _QUOTES + _CURRENCY) + ")")
_SUFFIX_RE = re.compile(
    r"(?:\.\.+|…|['’][sS]|—|–|" + _cls(_PUNCT + _QUOTES) + r"|(?<=[0-9])\+"
    r"|(?<=[0-9])(?:" + _UNITS + "|" + _cls(_CURRENCY) + r")"
    r"|(?<=°[FfCcKk])\.)$")
_INFIX_RE = re.compile(
    r"\.\.+|…|°|(?<=[0-9])[+\-*^](?=[0-9-])"
    r"|(?<=" + _L + r"),(?=" + _L + ")"
    r"|(?<=[0-9]|" + _L + r")(?:---|--|-|–|—|~)(?=" + _L + ")"
    r"|(?<=[0-9]|" + _L + r")[:<>=/](?=" + _L + ")")
_URL_RE = re.compile(r"(?:[a-zA-Z][a-zA-Z0-9+.\-]*://|www\.)\S+|[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+"
                     r"|(?:[\w\-]+\.)+[a-z]{2,63}(?:[/?#]\S*)?")
_CONTRACTION_RE = re.compile(r"(?i)(" + _L + r"+)(n['’]t|['’](?:m|re|ve|ll|d))")

# Kept whole: abbreviations with their period (titles, months, companies, US states, Latin)
# and the clitics split off by the rules above when they stand alone.
_ABBREVIATIONS = frozenset("""
Mr. Mrs. Ms. Dr. Prof. St. Mt. Jr. Sr. Gen. Gov. Sen. Rep. Rev. Adm. Messrs. Inc. Ltd. Co.
Corp. Bros. co. Jan. Feb. Mar. Apr. Jun. Jul. Aug. Sep. Sept. Oct. Nov. Dec. Ala. Ariz. Ark.
Calif. Colo. Conn. Del. Fla. Ga. Ill. Ind. Kan. Kans. Ky. La. Md. Mass. Mich. Minn. Miss. Mo.
Mont. Neb. Nebr. Nev. Okla. Ore. Pa. Tenn. Va. Wash. Wis. Ak. Ia. Id. D.C. N.C. N.D. N.H. N.J.
N.M. N.Y. S.C. Ph.D. e.g. E.g. E.G. i.e. I.e. I.E. vs. v.s. a.m. p.m.
a. b. c. d. e. f. g. h. i. j. k. l. m. n. o. p. q. r. s. t. u. v. w. x. y. z. ä. ö. ü.
's 'S ’s ’S n't n’t
""".split())
#: the chunks kept whole with their periods (abbreviations) and the lone clitics
ABBREVIATIONS: frozenset[str] = _ABBREVIATIONS
#: the one-character prefixes (``PREFIX_MARKS``) and suffixes (``SUFFIX_MARKS``) split off
#: a chunk by the affix rules; apostrophes left out (they start clitics like ``'s``)
PREFIX_MARKS: frozenset[str] = frozenset(_PUNCT + _QUOTES + _CURRENCY) - {"'", "’"}
SUFFIX_MARKS: frozenset[str] = frozenset(_PUNCT + _QUOTES) - {"'", "’"}
#: the units split off after a number (``16GB`` → ``16 GB``)
UNIT_WORDS: frozenset[str] = frozenset(_UNITS.replace("\\.", ".").split("|"))

_CACHE: dict[str, tuple[str, ...]] = {}
_STATS: dict[str, tuple[int, int, int, int]] = {}
_CACHE_MAX = 500_000
_LAST: list[tuple[str, tuple[str, ...]]] = []  # the last few texts split (filters share)


def _split_infixes(s: str) -> list[str]:
    if s in _ABBREVIATIONS or _URL_RE.fullmatch(s):
        return [s]
    if s.lower() == "cannot":
        return [s[:3], s[3:]]
    m = _CONTRACTION_RE.fullmatch(s)
    if m:
        return [m.group(1), m.group(2)]
    spans = [m.span() for m in _INFIX_RE.finditer(s)]
    if "." in s[1:-1]:  # a period between a lower-case and an upper-case letter
        spans += [(i, i + 1) for i in range(1, len(s) - 1) if s[i] == "."
                  and (_lower_like(s[i - 1]) or s[i - 1] in _QUOTES)
                  and (s[i + 1].isupper() or s[i + 1] in _QUOTES)]
        spans.sort()
    out: list[str] = []
    start = 0
    for a, b in spans:
        if a < start:
            continue
        if a == 0 and start == 0:
            continue
        if a > start:
            out.append(s[start:a])
        out.append(s[a:b])
        start = b
    if start < len(s):
        out.append(s[start:])
    return out


def _split_chunk(chunk: str) -> tuple[str, ...]:
    """One whitespace-free chunk → its words (prefixes, middle split at infixes, suffixes)."""
    if chunk.isalpha() or chunk.isdigit():  # most chunks: no rule applies
        return (chunk,) if chunk.lower() != "cannot" else (chunk[:3], chunk[3:])
    body, last = chunk[:-1], chunk[-1]
    if body.isalpha() and body.lower() != "cannot" and chunk not in _ABBREVIATIONS and (
            last in ",;:!?)\"" or (last == "." and _lower_like(body[-1]))):
        return body, last  # "word," "word." "word)": one suffix
    head: list[str] = []
    tail: list[str] = []
    s = chunk
    while s and s not in _ABBREVIATIONS:
        m = _PREFIX_RE.match(s)
        if m is not None or (s and _is_symbol(s[0])):
            n = m.end() if m is not None else 1
            if n == len(s):
                break
            head.append(s[:n])
            s = s[n:]
            continue
        m = _SUFFIX_RE.search(s)
        if m is not None and m.start() > 0:
            tail.append(m.group())
            s = s[:m.start()]
            continue
        if _period_suffix(s):
            tail.append(".")
            s = s[:-1]
            continue
        if len(s) > 1 and _is_symbol(s[-1]):
            tail.append(s[-1])
            s = s[:-1]
            continue
        break
    if s:
        head.extend(_split_infixes(s))
    head.extend(reversed(tail))
    return tuple(head)


def split_chunk(chunk: str) -> tuple[str, ...]:
    """The words of one whitespace-free ``chunk`` (not cached)."""
    return _split_chunk(chunk)


def _words_of(chunks: list[str]) -> dict[str, tuple[str, ...]]:
    """The chunk → words cache, filled for every chunk in ``chunks``."""
    cache = _CACHE
    missing = set(chunks).difference(cache)
    if len(cache) + len(missing) > _CACHE_MAX:
        cache.clear()
        _STATS.clear()
        missing = set(chunks)
    for chunk in missing:
        cache[chunk] = _split_chunk(chunk)
    return cache


def split_words(text: str) -> tuple[str, ...]:
    """The words of ``text`` (spaCy-English-like rules, see the module docstring); no
    whitespace, punctuation marks as words of their own. O(len(text)); splits are cached
    per chunk, and the last few texts' words are kept, so several filters of one document
    split it once."""
    for t, w in _LAST:
        if t is text:
            return w
    chunks = text.split()
    words = tuple(itertools.chain.from_iterable(map(_words_of(chunks).__getitem__, chunks)))
    _LAST.insert(0, (text, words))
    del _LAST[4:]
    return words


def _chunk_stats(words: tuple[str, ...]) -> tuple[int, int, int, int]:
    content = [w for w in words if not is_punct_word(w)]
    alpha = sum(1 for w in words if any(map(str.isalpha, w)))
    return len(words), len(content), sum(map(len, content)), alpha


def word_counts(text: str) -> tuple[int, int, int, int, set[str]]:
    """Gopher's word statistics of ``text``: (words, non-punctuation words, characters in
    non-punctuation words, words holding a letter, the set of distinct words). Computed
    per distinct chunk (cached), so a document costs about one ``Counter`` of its chunks."""
    counts = Counter(text.split())
    chunks = list(counts)
    cache = _words_of(chunks)
    stats = _STATS
    for chunk in set(chunks).difference(stats):
        stats[chunk] = _chunk_stats(cache[chunk])
    st = list(map(stats.__getitem__, chunks))
    k = list(counts.values())
    totals = [sum(map(operator.mul, k, map(operator.itemgetter(i), st))) for i in range(4)]
    vocab: set[str] = set().union(*map(cache.__getitem__, chunks))
    return totals[0], totals[1], totals[2], totals[3], vocab


def count_sentences(words: list[str]) -> int:
    """Sentences in a run of ``words`` (spaCy ``sentencizer`` rule): a new sentence starts
    at the first non-punctuation word after a word that is one sentence terminal."""
    if not words:
        return 0
    n = 1
    seen_end = False
    for w in words:
        if w in SENTENCE_TERMINALS:
            seen_end = True
        elif seen_end and not is_punct_word(w):
            n += 1
            seen_end = False
    return n
