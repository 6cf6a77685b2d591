"""The per-document word analysis the quality filters share (numba over code points):
every number equals what the Python word splitter gives for the same text, and C4's line
checks on the numba line table decide as its line-by-line Python loop, on real and
hostile texts. A sample always; every document of the four shared corpora when slow."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from tests.shared import corpora
from tokenmill.pipeline.document import analysis, chunk_memo
from tokenmill.pipeline.document.quality import C4_POLICY_SUBSTRINGS, C4QualityFilter
from tokenmill.pipeline.document.repetition import (
    _find_duplicates,
    _split_lines,
    duplicates,
    fineweb_lines,
    gopher_duplicates,
    line_ends_counts,
)
from tokenmill.pipeline.document.words import (
    SENTENCE_TERMINALS,
    count_sentences,
    is_punct_word,
    split_chunk,
    split_words,
    word_counts,
)
from tokenmill.pipeline.stage import Document

ALL = ("c4-en-sample", "cc-main-2019-sample", "wikipedia-wikitext-sample", "python-docs-rst")
HOSTILE = ["", " ", "\n\n", "a\r\nb\rc\x0bd\x0ce\x1cf\x85g\u2028h\u2029i", "Cannot, cannot.",
           "CANNOT go. Mr. Smith's U.S. e.g. it. (word), 58.19 1,000 10:30 don't I'm",
           "𝐇𝐞𝐥𝐥𝐨 𝐰𝐨𝐫𝐥𝐝. 😀😀 ok! 𝟏𝟐𝟑", "a\ud800b c.", "x [1] y. z {a}. lorem ipsum.",
           "One two three.\nEnable JavaScript to go on.\nWe use cookies here.\nFour five six.\n"
           "Lorem Ipsum dolor sit.\nA {b} c d.", "a b c.\nuse {x} of y.\nUSE COOKIES a b.\nx y z.",
           "Read the terms of use, now.\nI see it.\nok then we go.\n{ a b c.\nlorem ipsum a b.",
           "One two three.\nWe use coo\u212aies here.\nFour five six.", "A b c.\nX \u0130 y z.",
           "...a.... b..... c......\n#x ## \u2026\u2026.\n- one ..\n \u2022 two \u2026\n..",
           "JavaScript a b.\nx terms of use y.\nterms\nof use a b.\nPOLICY a. cooKie b c.\n"
           "Lorem\u00a0ipsum x y.\n  policy  a b.\n kie coo a b.\nipsum lorem a b.\njavascrip t.\n"
           "f p y k j a.\nterms of usE. b c\n ookie cookie. x"]


def _sample() -> list[str]:
    naughty = json.loads((corpora("naughty-strings") / "data" / "blns.json").read_text())
    web = []
    for f in sorted((corpora("c4-en-sample") / "data").glob("*.gz"))[:1]:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            web += [json.loads(line)["text"] for line, _ in zip(fh, range(60), strict=False)]
    return HOSTILE + [t for t in naughty + web if isinstance(t, str)]


def _every_document() -> list[str]:
    from tests.pipeline.test_quality_reference import _texts

    return [t for _, t in _texts(ALL)]


def _check_words(texts: list[str]) -> None:
    seen: dict[int, str] = {}
    for text in texts:
        tw = analysis.analyze(text)
        assert analysis.analyze(text) is tw  # cached per text
        words = split_words(text)
        n_words, n_content, chars, n_alpha, _ = word_counts(text)
        assert tw.totals.tolist() == [n_words, n_content, chars, n_alpha]
        assert tw.word_len.tolist() == [len(w) for w in words]
        assert tw.word_kind.tolist() == [
            is_punct_word(w) | 2 * any(map(str.isalpha, w)) | 4 * (w in SENTENCE_TERMINALS)
            for w in words]
        for h, w in zip(tw.word_hash.tolist(), words, strict=True):
            assert seen.setdefault(h, w) == w  # equal hashes, equal words
        lines = [ln.split() for ln in text.splitlines()]
        ends = np.cumsum([len(ln) for ln in lines], dtype=np.int64)
        starts = ends - np.array([len(ln) for ln in lines], np.int64)
        assert tw.sentences(starts, ends) == sum(
            count_sentences(list(split_words(" ".join(ln)))) for ln in lines)
        assert tw.stop_word_count(analysis.hashes_of(["the", "and", "58.19"])) == len(
            {"the", "and", "58.19"}.intersection(words))
        lines = analysis.line_table(tw)
        stripped = [ln.strip() for ln in text.splitlines()]
        assert lines[5].tolist() == [
            text.count("#"), text.count("..."), text.count("…"),
            sum(ln.startswith(("•", "-")) for ln in stripped),
            sum(ln.endswith(("...", "…")) for ln in stripped)]
    analysis.release()


def _check_c4_lines(texts: list[str]) -> None:
    """C4 on the numba line table decides and edits as on its Python line loop, and the
    analysis it leaves for the edited text is that text's own."""
    kernel, python = C4QualityFilter(), C4QualityFilter()
    python._fast = False
    assert kernel._fast
    for i, text in enumerate(texts):
        a, b = Document(key=str(i), source="s", text=text), Document(key=str(i), source="s",
                                                                      text=text)
        assert (kernel.reason(a), a.text) == (python.reason(b), b.text)
        assert analysis.word_count(a.text) == len(split_words(a.text))  # before analyze
        joined, fresh = analysis.analyze(a.text), analysis.split_text(a.text)
        for name in ("chunk_word", "word_hash", "word_len", "word_kind", "totals",
                     "code_points"):  # the kept lines' words, not split again
            assert getattr(joined, name).tolist() == getattr(fresh, name).tolist()
    assert kernel.line_stats == python.line_stats
    assert kernel.measures.values == python.measures.values
    analysis.release()


def test_word_analysis_matches_the_word_splitter_on_a_sample():
    _check_words(_sample())


def test_c4_line_table_decides_as_the_line_loop_on_a_sample():
    _check_c4_lines(_sample())


@pytest.mark.slow
def test_word_analysis_and_c4_lines_match_on_every_document():
    texts = _every_document()
    _check_words(texts)
    _check_c4_lines(texts)


def _arrays(tw: analysis.TextWords) -> list[list]:
    return [getattr(tw, name).tolist() for name in ("chunk_word", "word_hash", "word_len",
                                                     "word_kind", "totals", "code_points")]


def test_chunks_split_in_python_are_found_again_with_the_same_words():
    """A chunk the Python splitter split once is found in the chunk table the next time
    (no chunk left to Python), with the same words: on a cold table, a warm one, and one
    that is full (it keeps what it holds and learns no more)."""
    texts = _sample()
    analysis.reset()
    cold = [_arrays(analysis.split_text(t)) for t in texts]
    assert [_arrays(analysis.split_text(t)) for t in texts] == cold
    fill = analysis._CHUNKS[4]
    assert 0 < fill[0] < chunk_memo.ENTRIES
    fill[0] = chunk_memo.ENTRIES  # full
    assert _arrays(analysis.split_text("(never/seen)")) == _arrays(
        analysis.split_text("(never/seen) "[:-1]))
    assert fill[0] == chunk_memo.ENTRIES
    analysis.reset()
    assert fill[0] == 0
    assert [_arrays(analysis.split_text(t)) for t in texts] == cold
    text = "Dr. Who and/or U.S. e.g. cannot Author(s): 100% http://x.org/a?b=1"
    analysis.split_text(text)
    left = analysis._scan_words(analysis.code_points(text), analysis.FLAGS,
                                analysis._ABBREV_HASHES, analysis._UNIT_HASHES,
                                analysis._CHUNKS)[5]
    assert len(left) == 0


def _check_chunks(chunks: list[str]) -> None:
    tw = analysis.split_text(" ".join(chunks))
    want = [len(w) for c in chunks for w in split_chunk(c)]
    assert tw.word_len.tolist() == want


def test_numba_chunk_shapes_split_as_the_python_splitter():
    """Every character of the Basic Multilingual Plane alone, and random chunks built from
    the pieces the numba shapes read (letters of several cases and scripts, digits,
    hyphens, apostrophes, periods, closing and opening marks, clitics, units): each chunk
    splits into the words the Python splitter gives."""
    singles = [chr(c) for c in range(0x10000)
               if not chr(c).isspace() and not 0xD800 <= c < 0xE000]
    _check_chunks(singles)
    pieces = ["a", "Z", "5", "0", "-", "'", "’", ".", ",", "(", ")", '"', "”", "s", "t", "n",
              "m", "re", "ll", "GB", "km", "mbar", "µm", "é", "中", "I", "N", "T", "Mr", "e"]
    rng = np.random.default_rng(3)
    _check_chunks(["".join(rng.choice(pieces, int(rng.integers(2, 7))))
                   for _ in range(60_000)])


def test_duplicate_lines_and_paragraphs_count_as_the_python_lists():
    """Paragraphs, Gopher's lines and FineWeb's non-blank lines: segments, repeats and
    their characters as datatrove's ``find_duplicates`` counts them on the split lists."""
    texts = _sample() + ["\n", "\n\n", "a\n", "\na", "\na\n", " \n \n\n\n x \n\n\n\n x ",
                         "a\n\na\n\n\na \n\n a", "é\u2028é\n\né\r\né\n \n"]
    for text in texts:
        cp = analysis.code_points(text)
        lines = [ln for ln in text.split("\n") if ln and not ln.isspace()]
        parts = {"para": re.split(r"\n{2,}", text.strip()),
                 "line": _split_lines(text) if text else [], "nonblank": lines}
        for part, items in parts.items():
            n, n_dup, chars, starts, ends = duplicates(cp, part)
            assert (n, n_dup, chars) == (len(items), *_find_duplicates(items)), (part, text)
        assert [text[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)] == lines
        assert line_ends_counts(cp, analysis.FLAGS, starts, ends, 3) == (
            sum(ln[-1] in SENTENCE_TERMINALS for ln in lines), sum(len(ln) <= 3 for ln in lines))
        para, line = duplicates(cp, "para")[:3], duplicates(cp, "line")[:3]
        assert gopher_duplicates(cp, analysis.FLAGS) == (*para, *line)
        n, _, chars, _, _ = duplicates(cp, "nonblank")
        assert fineweb_lines(cp, analysis.FLAGS, 3) == (
            n, chars, *line_ends_counts(cp, analysis.FLAGS, starts, ends, 3),
            text.count("\n"))


def test_line_table_marks_every_line_c4_must_read():
    """A line whose ``lower()`` holds ``{``, ``javascript``, ``lorem ipsum`` or a policy
    phrase has the ``LINE_LOOK`` bit, whatever the case of its letters and also when a
    non-ASCII letter lower-cases to ASCII (the Kelvin sign to ``k``); plain lines have it
    not, and the other bits are as before."""
    for phrase in C4_POLICY_SUBSTRINGS + ("javascript", "lorem ipsum"):
        assert any(w in phrase for w in analysis.LOOK_WORDS), phrase
    hits = ["We use COOKIES.", "see the Terms Of Use", "JavaScript", "x {y} z", "loRem IpSum",
            "our privacy policy.", "coo\u212aie", "\u0130 here", "{"]
    plain = ["Plain words here.", "cook book", "terms of us", "polic y", "[1] a b c."]
    text = "\n".join(hits + plain)
    bits = analysis.line_table(analysis.split_text(text))[4]
    assert [bool(b & analysis.LINE_LOOK) for b in bits.tolist()] == \
        [True] * len(hits) + [False] * len(plain)
    assert bits[-1] & analysis.LINE_BRACKET and bits[-1] & analysis.LINE_TERMINAL
