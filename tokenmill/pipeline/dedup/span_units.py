"""Sentences, paragraphs and their repeated windows, for sentence-span and paragraph dedup
(:mod:`tokenmill.pipeline.dedup.span`), after datatrove 0.10.1's ``SentenceDedup``
(``pipeline/dedup/sentence_dedup.py``, its defaults; C4's "three-sentence span"
dedup, Raffel et al. 2020) and Dolma's paragraph dedup (Soldaini et al. 2024).

Units:

``sentences``
    spaCy's ``sentencizer`` over spaCy's English tokenization (what datatrove's English
    word tokenizer runs), re-implemented on
    :func:`~tokenmill.pipeline.document.words.split_chunk`: text is cut into runs of
    whitespace and non-whitespace; a non-whitespace run is split into words; a whitespace
    run is a token of its own, less its first character when that is a space (spaCy
    attaches one space to the token before it); a sentence ends before the first token
    that is not punctuation (every character of Unicode category ``P*``) after a token that
    is one of the sentencizer's terminal characters (:data:`SENTENCIZER_TERMINALS`).
    A sentence's *own* characters run from the end of the sentence before it to its own
    end (the text datatrove's filter keeps per sentence).
``paragraphs``
    lines split at ``\\n`` (Dolma; the normalize stage made every line separator ``\\n``);
    a line owns its characters and the ``\\n`` after it.

A *window* is ``n`` consecutive units; its key is the xxHash64 of the UTF-8 of the units'
:func:`~tokenmill.pipeline.decont.text.simplify_text` joined by one space (datatrove's
``simplify_text`` with its default ``TextNormConfig``, and its ``HashConfig``); a window
whose key text is blank is never a repeat. A window is *repeated* when the same key
starts earlier in the global document order (document, then unit); every unit of a
repeated window is cut (:func:`cut_spans`), and a document whose text changed is kept only
when it still has ``min_doc_words`` words and ``min_num_sentences`` sentences
(:func:`too_short`; datatrove's rule).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

import numpy as np

from tokenmill.pipeline.decont.text import hash_strings, simplify_text
from tokenmill.pipeline.document.words import split_chunk, split_words

MODES = ("sentences", "paragraphs")

# spaCy 3.8's Sentencizer.default_punct_chars (128 characters), as ranges
_TERMINAL_RANGES = (
    (0x21, 0x21), (0x2E, 0x2E), (0x3F, 0x3F), (0x589, 0x589), (0x61F, 0x61F),
    (0x6D4, 0x6D4), (0x700, 0x702), (0x7F9, 0x7F9), (0x964, 0x965), (0x104A, 0x104B),
    (0x1362, 0x1362), (0x1367, 0x1368), (0x166E, 0x166E), (0x1735, 0x1736),
    (0x1803, 0x1803), (0x1809, 0x1809), (0x1944, 0x1945), (0x1AA8, 0x1AAB),
    (0x1B5A, 0x1B5B), (0x1B5E, 0x1B5F), (0x1C3B, 0x1C3C), (0x1C7E, 0x1C7F),
    (0x203C, 0x203D), (0x2047, 0x2049), (0x2E2E, 0x2E2E), (0x2E3C, 0x2E3C),
    (0x3002, 0x3002), (0xA4FF, 0xA4FF), (0xA60E, 0xA60F), (0xA6F3, 0xA6F3),
    (0xA6F7, 0xA6F7), (0xA876, 0xA877), (0xA8CE, 0xA8CF), (0xA92F, 0xA92F),
    (0xA9C8, 0xA9C9), (0xAA5D, 0xAA5F), (0xAAF0, 0xAAF1), (0xABEB, 0xABEB),
    (0xFE52, 0xFE52), (0xFE56, 0xFE57), (0xFF01, 0xFF01), (0xFF0E, 0xFF0E),
    (0xFF1F, 0xFF1F), (0xFF61, 0xFF61), (0x10A56, 0x10A57), (0x11047, 0x11048),
    (0x110BE, 0x110C1), (0x11141, 0x11143), (0x111C5, 0x111C6), (0x111CD, 0x111CD),
    (0x111DE, 0x111DF), (0x11238, 0x11239), (0x1123B, 0x1123C), (0x112A9, 0x112A9),
    (0x1144B, 0x1144C), (0x115C2, 0x115C3), (0x115C9, 0x115D7), (0x11641, 0x11642),
    (0x1173C, 0x1173E), (0x11A42, 0x11A43), (0x11A9B, 0x11A9C), (0x11C41, 0x11C42),
    (0x16A6E, 0x16A6F), (0x16AF5, 0x16AF5), (0x16B37, 0x16B38), (0x16B44, 0x16B44),
    (0x1BC9F, 0x1BC9F), (0x1DA88, 0x1DA88),
)
#: the characters that end a sentence when they are a token of their own
SENTENCIZER_TERMINALS: frozenset[str] = frozenset(
    chr(c) for lo, hi in _TERMINAL_RANGES for c in range(lo, hi + 1))
_RUNS = re.compile(r"\S+|\s+")


@functools.lru_cache(maxsize=1 << 18)
def _chunk_tokens(chunk: str) -> tuple[tuple[int, int], ...]:
    """``(end offset in chunk, kind)`` per word of ``chunk``: kind 2 a sentence terminal,
    1 other punctuation, 0 anything else."""
    words = split_chunk(chunk)
    if "".join(words) != chunk:
        words = (chunk,)
    out, at = [], 0
    for w in words:
        at += len(w)
        kind = 2 if w in SENTENCIZER_TERMINALS else int(
            all(unicodedata.category(c)[0] == "P" for c in w))
        out.append((at, kind))
    return tuple(out)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """spaCy's sentencizer's ``(start_char, end_char)`` per sentence of ``text`` (module
    docstring), whitespace-only sentences included; ``[]`` for a text without tokens."""
    spans: list[tuple[int, int]] = []
    start = end = -1
    seen_end = False
    for m in _RUNS.finditer(text):
        a, run = m.start(), m.group()
        if run[0].isspace():
            if a and run[0] == " ":
                a, run = a + 1, run[1:]
            toks: Sequence[tuple[int, int]] = ((len(run), 0),) if run else ()
        else:
            toks = _chunk_tokens(run)
        prev = a
        for off, kind in toks:
            if start < 0:
                start = prev
            elif seen_end and kind == 0:
                spans.append((start, end))
                start, seen_end = prev, False
            if kind == 2:
                seen_end = True
            end = a + off
            prev = end
    if start >= 0:
        spans.append((start, end))
    return spans


def unit_bounds(text: str, mode: str) -> tuple[np.ndarray, list[str]]:
    """``(bounds int64[units + 1], unit texts)``: unit ``k`` owns characters
    ``[bounds[k], bounds[k + 1])`` (module docstring; text after the last sentence is owned
    by none); the unit texts are what its key is made of (a sentence without the
    whitespace before it). Whitespace-only sentences (only ever at the end) are left out.

    Raises:
        ValueError: an unknown ``mode``."""
    if mode == "sentences":
        spans = [(a, b) for a, b in sentence_spans(text) if not text[a:b].isspace()]
        bounds = [0] + [b for _, b in spans]
        return np.asarray(bounds, np.int64), [text[a:b] for a, b in spans]
    if mode == "paragraphs":
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the "\n" ending the last line starts no line (str.splitlines)
        ends = np.cumsum([len(x) + 1 for x in lines], dtype=np.int64)
        bounds = np.concatenate(([0], np.minimum(ends, len(text))))
        return bounds.astype(np.int64), lines
    raise ValueError(f"span dedup: mode must be one of {MODES}, got {mode!r}")


def window_keys(units: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keys uint64[m], starts int32[m])``: the key of every window of ``n`` units whose
    key text is not blank, and its first unit (none when there are fewer than ``n``)."""
    simple = [simplify_text(u) for u in units]
    grams = [" ".join(simple[i : i + n]) for i in range(len(simple) - n + 1)]
    starts = [i for i, g in enumerate(grams) if g.strip()]
    return (hash_strings([grams[i] for i in starts]),
            np.asarray(starts, np.int32))


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def cut_spans(text: str, bounds: np.ndarray, repeated: np.ndarray, n: int, mode: str
              ) -> list[tuple[int, int]]:
    """The characters ``[start, end)`` to cut from ``text`` (sorted, disjoint): the units
    of every window starting at a unit of ``repeated``, each run of cut units with its
    own characters. In paragraph mode a run that reaches the last line takes the ``\\n``
    before it (the last line owns the text's end); a run from the first unit takes the
    whitespace after it: what datatrove's filter leaves out when it joins the kept units
    and strips the result's start."""
    units = bounds.size - 1
    cover = np.zeros(units + 1, np.int64)
    np.add.at(cover, np.minimum(repeated, units), 1)
    np.add.at(cover, np.minimum(np.asarray(repeated, np.int64) + n, units), -1)
    cut = np.cumsum(cover[:units]) > 0
    edges = np.flatnonzero(np.diff(np.concatenate(([0], cut, [0])).astype(np.int8)))
    out: list[tuple[int, int]] = []
    for i, j in edges.reshape(-1, 2).tolist():  # units [i, j)
        a, b = int(bounds[i]), int(bounds[j])
        if j == units and mode == "paragraphs" and i > 0:
            a -= 1
        if i == 0:
            b = _skip_space(text, b)
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def apply_cuts(text: str, cuts: Sequence[tuple[int, int]]) -> str:
    """``text`` less the sorted, disjoint character spans ``cuts``."""
    pieces, at = [], 0
    for a, b in cuts:
        pieces.append(text[at:a])
        at = b
    pieces.append(text[at:])
    return "".join(pieces)


def too_short(text: str, cuts: Sequence[tuple[int, int]], mode: str, min_doc_words: int,
              min_num_sentences: int) -> str | None:
    """Why ``text`` less ``cuts`` is removed (datatrove's rule), or ``None``: ``empty``,
    ``too_few_words (W < min)`` (words of spaCy's English rules) or
    ``too_few_sentences (S < min)`` (sentencizer sentences, at least one), judged on the
    text as datatrove's filter leaves it: the kept units joined, the start stripped (in
    paragraph mode without the ``\\n`` that ended a kept last line); a minimum ``<= 0``
    is not checked."""
    joined = apply_cuts(text, cuts).lstrip()
    if not joined:
        return "empty"
    if min_doc_words > 0 and (w := len(split_words(joined))) < min_doc_words:
        return f"too_few_words ({w} < {min_doc_words})"
    if mode == "paragraphs" and text.endswith("\n") and joined.endswith("\n") \
            and not (cuts and cuts[-1][1] == len(text)):
        joined = joined[:-1]
    if min_num_sentences > 0 and \
            (s := max(1, len(sentence_spans(joined)))) < min_num_sentences:
        return f"too_few_sentences ({s} < {min_num_sentences})"
    return None


def dedup_texts(texts: Sequence[str], mode: str = "sentences", n: int = 3,
                min_doc_words: int = 50, min_num_sentences: int = 3
                ) -> list[tuple[list[tuple[int, int]], str | None]]:
    """The whole decision in one process (for tests and benchmarks; the stage runs the
    same steps as Ray tasks): per text, in order, its cuts and ``None``, or ``([],
    reason)`` when the cut text is too short (:func:`too_short`)."""
    seen: set[int] = set()
    out: list[tuple[list[tuple[int, int]], str | None]] = []
    for text in texts:
        bounds, units = unit_bounds(text, mode)
        keys, starts = window_keys(units, n)
        repeated = []
        for k, s in zip(keys.tolist(), starts.tolist(), strict=True):
            if k in seen:
                repeated.append(s)
            seen.add(k)
        cuts = cut_spans(text, bounds, np.asarray(repeated, np.int64), n, mode)
        why = too_short(text, cuts, mode, min_doc_words, min_num_sentences) \
            if cuts else None
        out.append(([], why) if why else (cuts, None))
    return out
