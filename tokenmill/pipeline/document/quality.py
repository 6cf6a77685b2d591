"""Heuristic quality filters: Gopher quality, Gopher repetition, C4 and FineWeb.

Each filter is a :class:`~tokenmill.pipeline.stage.DocumentFilter` (one stage, its own
counters); thresholds are constructor keyword arguments defaulting to the values the
original projects published, so a datamix file can override any of them::

    from tokenmill.pipeline.document.quality import QUALITY_FILTERS, build_quality_filter
    stage = build_quality_filter("gopher_quality", min_doc_words=30)
    kept = list(stage(docs))          # stage.stats.rejected: reason -> count

The rejection reason is ``"<filter name>:<check>"``, e.g. ``"gopher_quality:word_count"``
or ``"fineweb:line_punct_ratio"``. Names: ``gopher_quality``, ``gopher_repetition``,
``c4``, ``fineweb`` (:data:`QUALITY_FILTERS`).

Sources (thresholds and checks): Rae et al., "Scaling Language Models: Methods, Analysis
& Insights from Training Gopher" (2021), appendix A.1.1 ("MassiveText" quality and
repetition filters); Raffel et al., "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer" (2020), section 2.2 (C4); Penedo et al., "The FineWeb
Datasets" (2024), section 3.3 (the three FineWeb filters). The concrete rules follow
HuggingFace datatrove's implementations (``GopherQualityFilter``,
``GopherRepetitionFilter``, ``C4QualityFilter``, ``FineWebQualityFilter``; FineWeb's
reference), and ``tests/pipeline/test_quality_reference.py`` checks that both decide the
same on real corpora. Words and sentences come from :mod:`tokenmill.pipeline.document.words`, which
follows the rules of spaCy's English tokenizer and sentencizer (what datatrove uses)
without spaCy, so ``58.19`` is one word and ``Mr.`` ends no sentence.

:class:`C4QualityFilter` edits the document: like C4 and datatrove it drops lines (no
terminal punctuation, too few words, javascript, policy text, very long words) and keeps
the document only if enough sentences remain; dropped lines are counted in
``stage.line_stats``. Pass ``modify_text=False`` to only decide keep/remove.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

import numba
import numpy as np

from tokenmill.pipeline.document import analysis
from tokenmill.pipeline.document.measures import Measures
from tokenmill.pipeline.document.repetition import (
    duplicates,
    fineweb_lines,
    gopher_duplicates,
    ngram_stats,
)
from tokenmill.pipeline.document.words import SENTENCE_TERMINALS, split_words
from tokenmill.pipeline.stage import Document, DocumentFilter

# Gopher's stop-word list (Rae et al. 2021, A.1.1): at least two distinct ones must occur
# (as written, lower case, as in datatrove).
GOPHER_STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})

# C4 (Raffel et al. 2020; tensorflow/datasets c4_utils) as in datatrove.
# "lines that ended in a terminal punctuation mark (i.e. a period, exclamation mark, question
# mark, or end quotation mark)": straight quotes, as datatrove.
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
C4_ELLIPSIS = "..."
C4_POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies",
                        "use of cookies", "use cookies")
_C4_POLICY = re.compile("|".join(map(re.escape, C4_POLICY_SUBSTRINGS)))
C4_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")

# FineWeb's line-end "stop chars": the sentence terminals of every script (". ! ?" and their
# non-Latin equivalents; Unicode Sentence_Terminal). Not closing brackets or quotes.
TERMINAL_PUNCTUATION: tuple[str, ...] = tuple(sorted(SENTENCE_TERMINALS))

_WHOLE = np.zeros(1, np.int64)
# C4's line drops by verdict code (0: kept)
_DROPS = ("", "line_too_long_word", "line_no_terminal_punct", "line_too_few_words",
          "line_javascript", "line_policy")


def split_into_words(text: str) -> list[str]:
    """Words and punctuation marks of ``text``
    (:func:`tokenmill.pipeline.document.words.split_words`)."""
    return split_words(text)


class GopherQualityFilter(DocumentFilter):
    """Gopher quality rules (Rae et al. 2021, A.1.1; datatrove ``GopherQualityFilter``).

    Remove a document whose non-symbol word count is outside
    [``min_doc_words``, ``max_doc_words``] (``word_count``), whose mean non-symbol word
    length is outside [``min_avg_word_length``, ``max_avg_word_length``] characters
    (``mean_word_length``), with more than ``max_symbol_word_ratio`` ``#`` or ellipses per
    word (``symbol_ratio``), more than ``max_bullet_lines_ratio`` of lines starting with a
    bullet (``bullet_lines``), more than ``max_ellipsis_lines_ratio`` of lines ending in an
    ellipsis (``ellipsis_lines``), fewer than ``min_alpha_words_ratio`` of words holding a
    letter (``alpha_ratio``; datatrove calls it ``max_non_alpha_words_ratio``) or fewer than
    ``min_stop_words`` distinct Gopher stop words (``stop_words``; "the" twice is one).
    Words come from :func:`tokenmill.pipeline.document.words.split_words`. ``None`` disables a
    check.
    """

    name = "gopher_quality"
    version = 2  # 2: words/sentences split as spaCy does, thresholds as datatrove

    def __init__(self, min_doc_words: int | None = 50, max_doc_words: int | None = 100_000,
                 min_avg_word_length: float | None = 3, max_avg_word_length: float | None = 10,
                 max_symbol_word_ratio: float | None = 0.1,
                 max_bullet_lines_ratio: float | None = 0.9,
                 max_ellipsis_lines_ratio: float | None = 0.3,
                 min_alpha_words_ratio: float | None = 0.8, min_stop_words: int | None = 2,
                 stop_words: Iterable[str] | None = None) -> None:
        cfg: dict[str, Any] = dict(
            min_doc_words=min_doc_words, max_doc_words=max_doc_words,
            min_avg_word_length=min_avg_word_length, max_avg_word_length=max_avg_word_length,
            max_symbol_word_ratio=max_symbol_word_ratio,
            max_bullet_lines_ratio=max_bullet_lines_ratio,
            max_ellipsis_lines_ratio=max_ellipsis_lines_ratio,
            min_alpha_words_ratio=min_alpha_words_ratio, min_stop_words=min_stop_words,
            stop_words=sorted(stop_words) if stop_words is not None else None)
        super().__init__(**cfg)
        self.c = cfg
        self.stop_words = frozenset(stop_words) if stop_words is not None \
            else GOPHER_STOP_WORDS
        self._stop_hashes = analysis.hashes_of(self.stop_words)
        lengths = [len(w) for w in self.stop_words] or [0]
        self._stop_lengths = (min(lengths), max(lengths))
        self.measures = Measures()

    def reason(self, doc: Document) -> str | None:
        c = self.c
        text = doc.text
        tw = analysis.analyze(text)
        n_words, n, content_chars, n_alpha = tw.totals.tolist()
        record = self.measures.record
        record("gopher_quality:word_count", n)
        if c["min_doc_words"] is not None and n < c["min_doc_words"]:
            return "gopher_quality:word_count"
        if c["max_doc_words"] is not None and n > c["max_doc_words"]:
            return "gopher_quality:word_count"
        mean_len = content_chars / n if n else 0.0
        record("gopher_quality:mean_word_length", mean_len)
        if c["min_avg_word_length"] is not None and mean_len < c["min_avg_word_length"]:
            return "gopher_quality:mean_word_length"
        if c["max_avg_word_length"] is not None and mean_len > c["max_avg_word_length"]:
            return "gopher_quality:mean_word_length"
        lines = analysis.line_table(tw)
        n_hash, n_dots, n_ell, bullets, ell = lines[5].tolist()
        if c["max_symbol_word_ratio"] is not None and n_words:
            hashes = n_hash / n_words
            ellipses = (n_dots + n_ell) / n_words
            record("gopher_quality:symbol_ratio", max(hashes, ellipses))
            if max(hashes, ellipses) > c["max_symbol_word_ratio"]:
                return "gopher_quality:symbol_ratio"
        n_lines = len(lines[0])
        if n_lines:  # text.splitlines(), stripped
            if c["max_bullet_lines_ratio"] is not None:
                record("gopher_quality:bullet_lines", bullets / n_lines)
                if bullets / n_lines > c["max_bullet_lines_ratio"]:
                    return "gopher_quality:bullet_lines"
            if c["max_ellipsis_lines_ratio"] is not None:
                record("gopher_quality:ellipsis_lines", ell / n_lines)
                if ell / n_lines > c["max_ellipsis_lines_ratio"]:
                    return "gopher_quality:ellipsis_lines"
        if c["min_alpha_words_ratio"] is not None and n_words:
            record("gopher_quality:alpha_ratio", n_alpha / n_words)
            if n_alpha / n_words < c["min_alpha_words_ratio"]:
                return "gopher_quality:alpha_ratio"
        if c["min_stop_words"] is not None:
            n_stop = tw.stop_word_count(self._stop_hashes, *self._stop_lengths)
            record("gopher_quality:stop_words", n_stop)
            if n_stop < c["min_stop_words"]:
                return "gopher_quality:stop_words"
        return None


class GopherRepetitionFilter(DocumentFilter):
    """Gopher repetition rules (Rae et al. 2021, A.1.1 table A1; datatrove
    ``GopherRepetitionFilter``).

    Fractions of the document that are repeated: duplicate lines (``dup_line_frac`` of
    lines, ``dup_line_char_frac`` of characters), duplicate paragraphs (split at blank
    lines; ``dup_para_frac``, ``dup_para_char_frac``), the most frequent word n-gram's
    characters for n = 2, 3, 4 (``top_n_grams``: 0.20, 0.18, 0.16; reason ``top_<n>_gram``)
    and characters in duplicated n-grams for n = 5..10 (``dup_n_grams``: 0.15 .. 0.10;
    reason ``dup_<n>_gram``). Character fractions are of ``len(text)``. The n-gram counts
    run in numba (:func:`~.repetition.ngram_stats`) over per-word hashes.
    """

    name = "gopher_repetition"
    version = 2  # 2: words/sentences split as spaCy does, thresholds as datatrove

    def __init__(self, dup_line_frac: float | None = 0.3, dup_para_frac: float | None = 0.3,
                 dup_line_char_frac: float | None = 0.2,
                 dup_para_char_frac: float | None = 0.2,
                 top_n_grams: Sequence[tuple[int, float]] = ((2, 0.2), (3, 0.18), (4, 0.16)),
                 dup_n_grams: Sequence[tuple[int, float]] = (
                     (5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
                 ) -> None:
        cfg: dict[str, Any] = dict(
            dup_line_frac=dup_line_frac, dup_para_frac=dup_para_frac,
            dup_line_char_frac=dup_line_char_frac, dup_para_char_frac=dup_para_char_frac,
            top_n_grams=[list(x) for x in top_n_grams],
            dup_n_grams=[list(x) for x in dup_n_grams])
        super().__init__(**cfg)
        self.c = cfg
        self.measures = Measures()
        self._top_n = np.array([int(n) for n, _ in top_n_grams] or [0], np.int64)[
            : len(top_n_grams)]
        self._dup_n = np.array([int(n) for n, _ in dup_n_grams] or [0], np.int64)[
            : len(dup_n_grams)]

    def reason(self, doc: Document) -> str | None:
        c = self.c
        text = doc.text
        if not text:
            return "gopher_repetition:empty"
        n_chars = len(text)
        record = self.measures.record
        tw = analysis.analyze(text)
        dups = gopher_duplicates(tw.code_points, analysis.FLAGS)
        for k, part in enumerate(("para", "line")):
            n_items, n_dup, dup_chars = dups[3 * k:3 * k + 3]
            if c[f"dup_{part}_frac"] is not None and n_items:
                record(f"gopher_repetition:dup_{part}_frac", n_dup / n_items)
                if n_dup / n_items > c[f"dup_{part}_frac"]:
                    return f"gopher_repetition:dup_{part}_frac"
            if c[f"dup_{part}_char_frac"] is not None:
                record(f"gopher_repetition:dup_{part}_char_frac", dup_chars / n_chars)
                if dup_chars / n_chars > c[f"dup_{part}_char_frac"]:
                    return f"gopher_repetition:dup_{part}_char_frac"
        top, dup = ngram_stats(tw.word_hash, tw.word_len, self._top_n, self._dup_n)
        top, dup = top.tolist(), dup.tolist()  # Python ints: no numpy scalar arithmetic
        if top:
            record("gopher_repetition:top_n_gram", top[0] / n_chars)
        for (n, frac), chars in zip(c["top_n_grams"], top, strict=True):
            if chars / n_chars > frac:
                return f"gopher_repetition:top_{n}_gram"
        if dup:  # reached only by the documents every top n-gram rule kept
            record("gopher_repetition:dup_n_gram", dup[0] / n_chars)
        for (n, frac), chars in zip(c["dup_n_grams"], dup, strict=True):
            if chars / n_chars > frac:
                return f"gopher_repetition:dup_{n}_gram"
        return None


_LOOK = len(_DROPS)  # a line's verdict while it waits for the text checks in Python


@numba.njit(cache=True)
def _c4_verdicts(chunks, longest, term, min_words, no_term, citations, max_len):
    """C4's line drops on the line table's numbers (:func:`analysis.line_table`): per
    line a _DROPS index, 0 where kept, ``_LOOK`` where the text checks decide (a citation
    mark, or ``LINE_LOOK``); and how many lines are ``_LOOK``."""
    n = chunks.shape[0]
    verdict = np.empty(n, np.int64)
    n_look = 0
    for i in range(n):
        if max_len != -1 and longest[i] > max_len:
            verdict[i] = 1
        elif citations and term[i] & 2:  # LINE_BRACKET: checked after the marks go
            verdict[i] = _LOOK
        elif no_term and not term[i] & 1:  # LINE_TERMINAL
            verdict[i] = 2
        elif chunks[i] < min_words:
            verdict[i] = 3
        elif term[i] & 16:  # LINE_LOOK
            verdict[i] = _LOOK
        else:
            verdict[i] = 0
        n_look += verdict[i] == _LOOK
    return verdict, n_look


@numba.njit(cache=True)
def _c4_kept(verdict, starts, ends, chunks, term, citations):
    """(int64 lines per verdict, int64[2 * kept] (start, end) of the kept lines
    interleaved, the kept lines without a citation mark as interleaved [first, end) chunk
    spans)."""
    counts = np.zeros(_LOOK + 1, np.int64)
    n_kept, n_plain = 0, 0
    for i in range(verdict.shape[0]):
        counts[verdict[i]] += 1
        if verdict[i] == 0:
            n_kept += 1
            n_plain += not (citations and term[i] & 2)
    pairs = np.empty(2 * n_kept, np.int64)
    spans = np.empty(2 * n_plain, np.int64)
    k, p, pos = 0, 0, 0
    for i in range(verdict.shape[0]):
        pos += chunks[i]
        if verdict[i] == 0:
            pairs[k], pairs[k + 1] = starts[i], ends[i]
            k += 2
            if not (citations and term[i] & 2):
                spans[p], spans[p + 1] = pos - chunks[i], pos
                p += 2
    return counts, pairs, spans


class C4QualityFilter(DocumentFilter):
    """C4's clean-up rules (Raffel et al. 2020, section 2.2; datatrove ``C4QualityFilter``).

    Line by line (``split_paragraph``: lines are ``text.splitlines()``): drop a line with a
    word longer than ``max_word_length`` characters, strip Wikipedia citation marks, drop a
    line that does not end in terminal punctuation (``. ? ! "``) or ends in ``...``, that has
    fewer than ``min_words_per_line`` words, that mentions ``javascript``, or that holds
    cookie/privacy/terms-of-use policy text. Remove the document if a kept line contains
    ``lorem ipsum`` (``c4:lorem_ipsum``) or ``{`` (``c4:curly_bracket``), if fewer than
    ``min_num_sentences`` sentences remain (``c4:too_few_sentences``), or, when
    ``bad_words`` is given (C4 used the LDNOOBW list; none is bundled), if any kept word is
    in it (``c4:bad_words``). Kept documents get the kept lines as text when
    ``modify_text``.
    """

    name = "c4"
    version = 2  # 2: words/sentences split as spaCy does, thresholds as datatrove

    def __init__(self, split_paragraph: bool = True, remove_citations: bool = True,
                 filter_no_terminal_punct: bool = True, min_num_sentences: int = 5,
                 min_words_per_line: int = 3, max_word_length: int = 1000,
                 filter_lorem_ipsum: bool = True, filter_javascript: bool = True,
                 filter_curly_bracket: bool = True, filter_policy: bool = True,
                 bad_words: Iterable[str] | None = None, modify_text: bool = True) -> None:
        cfg: dict[str, Any] = dict(
            split_paragraph=split_paragraph, remove_citations=remove_citations,
            filter_no_terminal_punct=filter_no_terminal_punct,
            min_num_sentences=min_num_sentences, min_words_per_line=min_words_per_line,
            max_word_length=max_word_length, filter_lorem_ipsum=filter_lorem_ipsum,
            filter_javascript=filter_javascript, filter_curly_bracket=filter_curly_bracket,
            filter_policy=filter_policy,
            bad_words=sorted(bad_words) if bad_words is not None else None,
            modify_text=modify_text)
        super().__init__(**cfg)
        self.c = cfg
        self.bad_words = frozenset(w.lower() for w in bad_words) if bad_words else None
        self.line_stats: Counter = Counter()
        self.measures = Measures()
        # split lines: their numbers from the word analysis' line table in numba
        self._fast = split_paragraph and not self.bad_words

    def reason(self, doc: Document) -> str | None:
        c = self.c
        if not c["split_paragraph"]:
            lines = [s for s in re.split(r"(?<=[.!?])\s+", doc.text) if s]
        elif self._fast:
            lines = []  # the line table in numba has them
        else:
            lines = doc.text.splitlines()
        kept: list[str] = []
        spans: list[int] = []  # kept lines as [first, end) chunk of the document's chunks
        cited: list[str] = []  # kept lines that lost a citation mark
        if self._fast:
            why, at = self._kernel_lines(doc.text, kept, cited)
        else:
            why = self._lines(lines, kept, spans, cited)
            at = np.array(spans, np.int64)
        if why is not None:
            return why
        if c["split_paragraph"]:
            n_sent = analysis.analyze(doc.text).sentences(at[0::2], at[1::2])
            for line in cited:
                tw = analysis.split_text(line)
                n_sent += tw.sentences(_WHOLE[:1], np.array([len(tw.chunk_word) - 1]))
        else:
            n_sent = len(kept)
        self.measures.record("c4:too_few_sentences", n_sent)
        if c["min_num_sentences"] != -1 and n_sent < c["min_num_sentences"]:
            return "c4:too_few_sentences"
        if c["modify_text"]:
            text = ("\n" if c["split_paragraph"] else " ").join(kept).strip()
            if self._fast and not cited:  # the next filters read its words unsplit
                analysis.remember_joined(text, analysis.analyze(doc.text), at[0::2],
                                         at[1::2])
            doc.text = text
        return None

    def _kernel_lines(self, text: str, kept: list[str], cited: list[str]
                      ) -> tuple[str | None, np.ndarray]:
        """:meth:`_lines` of ``text.splitlines()`` on numbers from
        :func:`analysis.line_table` (in numba, :func:`_c4_verdicts`); only the lines
        they keep that may hold what the text checks look for (``LINE_LOOK``) or a
        citation mark are looked at in Python. Returns the reason (or ``None``) and the
        kept lines' chunk spans, interleaved as ``_lines`` leaves them in ``spans``."""
        c = self.c
        starts, ends, chunks, longest, term, _ = analysis.line_table(analysis.analyze(text))
        verdict, n_look = _c4_verdicts(chunks, longest, term, c["min_words_per_line"],
                                       c["filter_no_terminal_punct"], c["remove_citations"],
                                       c["max_word_length"])
        edited: dict[int, str] = {}  # kept lines that lost a citation mark
        for i in np.flatnonzero(verdict == _LOOK).tolist() if n_look else ():
            line = text[starts[i]:ends[i]]
            marked = c["remove_citations"] and bool(term[i] & analysis.LINE_BRACKET)
            if marked:
                line = C4_CITATION.sub("", line)
            why = self._look_at(line, marked, int(chunks[i]))
            if isinstance(why, int):
                verdict[i] = why
            elif why is not None:
                self._count_drops(verdict[:i])
                self.line_stats["line_total"] += i + 1
                return why, _WHOLE
            else:
                verdict[i] = 0
                if marked:
                    edited[i] = line
        counts, pairs, at = _c4_kept(verdict, starts, ends, chunks, term,
                                     c["remove_citations"])
        self._add_drops(counts)
        self.line_stats["line_total"] += len(starts)
        flat = iter(pairs.tolist())  # start, end, start, end, ...
        kept += [text[a:b] for a, b in zip(flat, flat, strict=True)]
        if edited:
            cited += edited.values()
            for j, i in enumerate(np.flatnonzero(verdict == 0).tolist()):
                kept[j] = edited.get(i, kept[j])
        return None, at

    def _look_at(self, line: str, marked: bool, n_chunks: int) -> int | str | None:
        """C4's text checks on one stripped line that the line table keeps (``marked``:
        it held a citation mark, now removed): a _DROPS index if the line goes, a reason
        if the document goes, else ``None``."""
        c = self.c
        if marked:
            if c["filter_no_terminal_punct"] and (
                    not line.endswith(C4_END_PUNCTUATION) or line.endswith(C4_ELLIPSIS)):
                return 2
            if n_chunks < c["min_words_per_line"]:
                return 3
        low = line.lower()
        if c["filter_lorem_ipsum"] and "lorem ipsum" in low:
            return "c4:lorem_ipsum"
        if c["filter_javascript"] and "javascript" in low:
            return 4
        if c["filter_curly_bracket"] and "{" in line:
            return "c4:curly_bracket"
        if c["filter_policy"] and _C4_POLICY.search(low):
            return 5
        return None

    def _count_drops(self, verdict: np.ndarray) -> None:
        """Count the dropped lines of ``verdict`` (int64 _DROPS indices per line) in
        ``line_stats``."""
        self._add_drops(np.bincount(verdict, minlength=len(_DROPS)))

    def _add_drops(self, counts: np.ndarray) -> None:
        """Add ``counts`` (int64 lines per _DROPS index, maybe more) to ``line_stats``."""
        for name, n in zip(_DROPS, counts.tolist(), strict=False):
            if name and n:
                self.line_stats[name] += n

    def _lines(self, lines: list[str], kept: list[str], spans: list[int],
               cited: list[str]) -> str | None:
        """Drop lines (counted in ``line_stats``), fill ``kept``, ``spans`` (per kept
        line its first and end chunk among the document's ``text.split()`` chunks) and
        ``cited`` (the kept lines that lost a citation mark, instead of a span); a reason
        if the document goes."""
        c = self.c
        stats = self.line_stats
        pos = 0  # chunks of the lines before this one (they are the text's chunks)
        for n_seen, line in enumerate(lines, 1):
            line = line.strip()
            words = line.split()
            pos += len(words)
            if c["max_word_length"] != -1 and max(map(len, words), default=0) > \
                    c["max_word_length"]:
                stats["line_too_long_word"] += 1
                continue
            has_mark = c["remove_citations"] and "[" in line
            if has_mark:
                line = C4_CITATION.sub("", line)
            if c["filter_no_terminal_punct"] and (not line.endswith(C4_END_PUNCTUATION)
                                                  or line.endswith(C4_ELLIPSIS)):
                stats["line_no_terminal_punct"] += 1
                continue
            if len(words) < c["min_words_per_line"]:
                stats["line_too_few_words"] += 1
                continue
            low = line.lower()
            if c["filter_lorem_ipsum"] and "lorem ipsum" in low:
                stats["line_total"] += n_seen
                return "c4:lorem_ipsum"
            if c["filter_javascript"] and "javascript" in low:
                stats["line_javascript"] += 1
                continue
            if c["filter_curly_bracket"] and "{" in line:
                stats["line_total"] += n_seen
                return "c4:curly_bracket"
            if c["filter_policy"] and any(p in low for p in C4_POLICY_SUBSTRINGS):
                stats["line_policy"] += 1
                continue
            if self.bad_words and any(w.lower() in self.bad_words
                                      for w in split_into_words(line)):
                stats["line_total"] += n_seen
                return "c4:bad_words"
            if has_mark:
                cited.append(line)
            else:
                spans += [pos - len(words), pos]
            kept.append(line)
        stats["line_total"] += len(lines)
        return None


class FineWebQualityFilter(DocumentFilter):
    """FineWeb's own filters (Penedo et al. 2024, section 3.3; datatrove
    ``FineWebQualityFilter``).

    Over non-blank lines: remove a document if fewer than ``line_punct_thr`` of lines end in
    a sentence terminal (``. ! ?`` and their equivalents in other scripts, Unicode
    ``Sentence_Terminal``; not ``)``, quotes or ``…``; the line as written, not right-stripped)
    (``line_punct_ratio``; with ``line_punct_exclude_zero`` a ratio of exactly 0 is let
    through), if more than ``short_line_thr`` of lines are at most ``short_line_length``
    characters (``short_line_ratio``), if duplicated lines hold more than
    ``char_duplicates_ratio`` of the non-newline characters (``char_dup_ratio``), or
    if there are more than ``new_line_ratio`` newlines per word (``list_ratio``). A
    document with no non-blank line is ``empty``.
    """

    name = "fineweb"
    version = 2  # 2: words/sentences split as spaCy does, thresholds as datatrove

    def __init__(self, line_punct_thr: float = 0.12, line_punct_exclude_zero: bool = False,
                 short_line_thr: float = 0.67, short_line_length: int = 30,
                 char_duplicates_ratio: float = 0.01, new_line_ratio: float = 0.3,
                 stop_chars: Sequence[str] | None = None) -> None:
        cfg: dict[str, Any] = dict(
            line_punct_thr=line_punct_thr, line_punct_exclude_zero=line_punct_exclude_zero,
            short_line_thr=short_line_thr, short_line_length=short_line_length,
            char_duplicates_ratio=char_duplicates_ratio, new_line_ratio=new_line_ratio,
            stop_chars=list(stop_chars) if stop_chars is not None else None)
        super().__init__(**cfg)
        self.c = cfg
        self.stop_chars = tuple(stop_chars) if stop_chars is not None else TERMINAL_PUNCTUATION
        # the sentence terminals: read from the code point flags in numba
        self._terminals = set(self.stop_chars) == set(TERMINAL_PUNCTUATION)
        self.measures = Measures()

    def reason(self, doc: Document) -> str | None:
        c = self.c
        text = doc.text
        cp = analysis.code_points(text)
        n_lines, dup_chars, n_term, n_short, n_newlines = fineweb_lines(
            cp, analysis.flags_for(cp), c["short_line_length"])
        if not n_lines:
            return "fineweb:empty"
        record = self.measures.record
        if not self._terminals:
            _, _, _, starts, ends = duplicates(cp, "nonblank")
            lines = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
            n_term = sum(map(str.endswith, lines, repeat(self.stop_chars)))
            n_short = sum(map(c["short_line_length"].__ge__, map(len, lines)))
        ratio = n_term / n_lines
        record("fineweb:line_punct_ratio", ratio)
        if ratio < c["line_punct_thr"] and not (ratio == 0 and c["line_punct_exclude_zero"]):
            return "fineweb:line_punct_ratio"
        ratio = n_short / n_lines
        record("fineweb:short_line_ratio", ratio)
        if ratio > c["short_line_thr"]:
            return "fineweb:short_line_ratio"
        ratio = dup_chars / max(1, len(text) - n_newlines)
        record("fineweb:char_dup_ratio", ratio)
        if ratio > c["char_duplicates_ratio"]:
            return "fineweb:char_dup_ratio"
        n_words = analysis.word_count(text)
        if n_words:
            record("fineweb:list_ratio", n_newlines / n_words)
        if n_words and n_newlines / n_words > c["new_line_ratio"]:
            return "fineweb:list_ratio"
        return None


QUALITY_FILTERS: dict[str, type[DocumentFilter]] = {
    cls.name: cls for cls in (GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter,
                              FineWebQualityFilter)
}


def build_quality_filter(name: str, **thresholds: Any) -> DocumentFilter:
    """The quality filter called ``name`` with ``thresholds`` overriding its defaults.

    Raises:
        ValueError: unknown filter name (the message lists the known ones).
        TypeError: unknown threshold name for that filter.
    """
    try:
        cls = QUALITY_FILTERS[name]
    except KeyError:
        raise ValueError(f"unknown quality filter {name!r}; known: "
                         f"{', '.join(sorted(QUALITY_FILTERS))}") from None
    return cls(**thresholds)
