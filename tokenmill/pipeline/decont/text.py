"""Normalized words and n-gram hashes for decontamination, after datatrove's
``NGramsDecontConfig`` (datatrove 0.10.1, ``pipeline/decont/n_grams.py`` and
``utils/text.py``; Penedo et al. 2024).

A text becomes words as datatrove's default ``simplify_text`` + English word tokenizer
make them: lower case, every run of digits (with one decimal part) -> ``0``, datatrove's
punctuation set -> spaces, whitespace collapsed, combining marks dropped after NFD; then
the words of :func:`~tokenmill.pipeline.document.words.split_words` (spaCy's English
rules), with spaCy's apostrophe-less contractions split (``cannot`` -> ``can not``).
An n-gram is ``n`` consecutive words joined by one space; its hash is the xxHash64 of its
UTF-8 bytes (datatrove's default ``HashConfig``), a ``uint64``.

:func:`word_spans` places each word back on the characters of the original text it comes
from (each normalization step carried per character), so that a matched n-gram can be cut
out of the text itself.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import numpy as np
import regex
import xxhash

from tokenmill.pipeline.document.words import split_words

# datatrove's PUNCTUATION (utils/text.py): ASCII marks, some CJK/typographic marks, and
# the control characters 0-8, 11-31 and 127-159 (tab and newline are whitespace)
_PUNCTUATION = ('!/:&(\\#%+^]~\';{|[=-`*$,><)?@_."}'
                "\u2014\u201d\uff05\uff11\u3008\u3001\u2501\u3010\u300c\u300d\uff0c\u3011"
                "\uff1b\u201c\u300a\u201e\u2019\u2236\xb4\uff0e\uff08\u2013\uff1f\uff01"
                "\uff1a\uff5e\xab\u3009\u300b\uff09\u3002\u2026\u25ba\xbb"
                + "".join(map(chr, (*range(0, 9), *range(11, 32), *range(127, 160)))))
_PUNCT_TO_SPACE = str.maketrans(_PUNCTUATION, " " * len(_PUNCTUATION))
# \p{Nd} needs the regex module (re has no Unicode property classes)
_NUMBER = regex.compile(r"\p{Nd}+([.,\u060c\u066b\u2396\u2397\u2398]{1}\p{Nd}+)?")
_WHITESPACE = re.compile(r"\s+")
# spaCy's English tokenizer exceptions (spacy/lang/en/tokenizer_exceptions.py) whose key
# has letters and digits only and that split into several words
_CONTRACTIONS = {
    "10am": "10 am", "10pm": "10 pm", "11am": "11 am", "11pm": "11 pm", "12am": "12 am",
    "12pm": "12 pm", "1am": "1 am", "1pm": "1 pm", "2am": "2 am", "2pm": "2 pm", "3am": "3 am",
    "3pm": "3 pm", "4am": "4 am", "4pm": "4 pm", "5am": "5 am", "5pm": "5 pm", "6am": "6 am",
    "6pm": "6 pm", "7am": "7 am", "7pm": "7 pm", "8am": "8 am", "8pm": "8 pm", "9am": "9 am",
    "9pm": "9 pm", "aint": "ai nt", "arent": "are nt", "cannot": "can not", "cant": "ca nt",
    "cantve": "ca nt ve", "couldnt": "could nt", "couldntve": "could nt ve",
    "couldve": "could ve", "darent": "dare nt", "didnt": "did nt", "didntve": "did nt ve",
    "doesnt": "does nt", "doesntve": "does nt ve", "dont": "do nt", "dontve": "do nt ve",
    "gonna": "gon na", "gotta": "got ta", "hadnt": "had nt", "hadntve": "had nt ve",
    "hasnt": "has nt", "havent": "have nt", "hed": "he d", "hedve": "he d ve",
    "hellve": "he ll ve", "hes": "he s", "howd": "how d", "howdve": "how d ve",
    "howll": "how ll", "howllve": "how ll ve", "howre": "how re", "hows": "how s",
    "howve": "how ve", "id": "i d", "idve": "i d ve", "illve": "i ll ve", "im": "i m",
    "ima": "i m a", "isnt": "is nt", "itd": "it d", "itdve": "it d ve", "itll": "it ll",
    "itllve": "it ll ve", "ive": "i ve", "maynt": "may nt", "mayntve": "may nt ve",
    "mightnt": "might nt", "mightntve": "might nt ve", "mightve": "might ve",
    "mustnt": "must nt", "mustntve": "must nt ve", "mustve": "must ve", "neednt": "need nt",
    "needntve": "need nt ve", "notve": "not ve", "oughtnt": "ought nt",
    "oughtntve": "ought nt ve", "shant": "sha nt", "shantve": "sha nt ve",
    "shedve": "she d ve", "shellve": "she ll ve", "shes": "she s", "shouldnt": "should nt",
    "shouldntve": "should nt ve", "shouldve": "should ve", "thatd": "that d",
    "thatdve": "that d ve", "thatll": "that ll", "thatllve": "that ll ve", "thats": "that s",
    "thered": "there d", "theredve": "there d ve", "therell": "there ll",
    "therellve": "there ll ve", "therere": "there re", "theres": "there s",
    "thereve": "there ve", "thesed": "these d", "thesedve": "these d ve",
    "thesell": "these ll", "thesellve": "these ll ve", "thesere": "these re",
    "theseve": "these ve", "theyd": "they d", "theydve": "they d ve", "theyll": "they ll",
    "theyllve": "they ll ve", "theyre": "they re", "theyve": "they ve", "thisd": "this d",
    "thisdve": "this d ve", "thisll": "this ll", "thisllve": "this ll ve", "thiss": "this s",
    "thosed": "those d", "thosedve": "those d ve", "thosell": "those ll",
    "thosellve": "those ll ve", "thosere": "those re", "thoseve": "those ve",
    "wasnt": "was nt", "wed": "we d", "wedve": "we d ve", "wellve": "we ll ve",
    "werent": "were nt", "weve": "we ve", "whatd": "what d", "whatdve": "what d ve",
    "whatll": "what ll", "whatllve": "what ll ve", "whatre": "what re", "whats": "what s",
    "whatve": "what ve", "whend": "when d", "whendve": "when d ve", "whenll": "when ll",
    "whenllve": "when ll ve", "whenre": "when re", "whens": "when s", "whenve": "when ve",
    "whered": "where d", "wheredve": "where d ve", "wherell": "where ll",
    "wherellve": "where ll ve", "wherere": "where re", "wheres": "where s",
    "whereve": "where ve", "whod": "who d", "whodve": "who d ve", "wholl": "who ll",
    "whollve": "who ll ve", "whos": "who s", "whove": "who ve", "whyd": "why d",
    "whydve": "why d ve", "whyll": "why ll", "whyllve": "why ll ve", "whyre": "why re",
    "whys": "why s", "whyve": "why ve", "wont": "wo nt", "wontve": "wo nt ve",
    "wouldnt": "would nt", "wouldntve": "would nt ve", "wouldve": "would ve", "yall": "y all",
    "youd": "you d", "youdve": "you d ve", "youll": "you ll", "youllve": "you ll ve",
    "youre": "you re", "youve": "you ve",
}
_SPLIT_CONTRACTIONS = {k: tuple(v.split()) for k, v in _CONTRACTIONS.items()}


def simplify_text(text: str) -> str:
    """``text`` normalized as datatrove's ``simplify_text`` with its default
    ``TextNormConfig`` (see the module docstring)."""
    text = _NUMBER.sub("0", text.lower())
    text = _WHITESPACE.sub(" ", text.translate(_PUNCT_TO_SPACE).strip())
    if not text.isascii():  # ASCII has no combining marks and is its own NFD
        text = "".join(c for c in unicodedata.normalize("NFD", text)
                       if unicodedata.category(c) != "Mn")
    return text.strip()


def normalized_words(text: str) -> list[str]:
    """The normalized words of ``text`` (the unit of decontamination n-grams)."""
    out: list[str] = []
    for w in split_words(simplify_text(text)):
        out.extend(_SPLIT_CONTRACTIONS.get(w, (w,)))
    return out


def ngram_strings(words: Sequence[str], n: int) -> list[str]:
    """Every ``n`` consecutive words joined by a space (none when fewer than ``n``)."""
    return [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]


def hash_strings(strings: Sequence[str]) -> np.ndarray:
    """xxHash64 of each string's UTF-8 bytes: ``uint64`` array of ``len(strings)``."""
    h = xxhash.xxh64_intdigest
    return np.fromiter((h(s.encode()) for s in strings), dtype=np.uint64, count=len(strings))


def example_ngrams(label: str, query: str | None, n: int, query_ngrams: bool,
                   overlap_ngrams: bool) -> list[str]:
    """The n-grams an eval example contributes (datatrove's ``compute_hashes``): the
    label's; with ``query_ngrams`` the query's; with ``overlap_ngrams`` the ``n - 1``
    windows that end in the label's first words and start in the query's last words."""
    label_words = normalized_words(label)
    grams = ngram_strings(label_words, n)
    if query is not None:
        query_words = normalized_words(query)
        if query_ngrams:
            grams += ngram_strings(query_words, n)
        if overlap_ngrams:
            grams += [" ".join(query_words[len(query_words) - (n - 1 - i):]
                               + label_words[:i + 1])
                      for i in range(n - 1)
                      if len(query_words) >= n - 1 - i and len(label_words) >= i + 1]
    return grams


def _simplified_with_origins(text: str) -> tuple[str, list[int], list[int]] | None:
    """:func:`simplify_text` of ``text`` and, per character of it, the span ``[start,
    end)`` of ``text`` it comes from; ``None`` when the step-by-step mapping does not
    give :func:`simplify_text`'s string (canonical reordering of marks that are not
    ``Mn``, which per-character NFD does not do)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        starts = list(range(len(text)))
    else:  # a character whose lower case is longer ('İ' -> 'i̇')
        starts = [i for i, c in enumerate(text) for _ in c.lower()]
    ends = [s + 1 for s in starts]
    pieces, s2, e2, at = [], [], [], 0
    for m in _NUMBER.finditer(lowered):  # a number becomes "0", spanning its digits
        pieces += [lowered[at:m.start()], "0"]
        s2 += starts[at:m.start()] + [starts[m.start()]]
        e2 += ends[at:m.start()] + [ends[m.end() - 1]]
        at = m.end()
    pieces.append(lowered[at:])
    s2 += starts[at:]
    e2 += ends[at:]
    spaced = "".join(pieces).translate(_PUNCT_TO_SPACE)
    keep = [i for i, c in enumerate(spaced)  # whitespace runs -> one space, no ends
            if not c.isspace() or (i and not spaced[i - 1].isspace())]
    chars = [" " if spaced[i].isspace() else spaced[i] for i in keep]
    s3, e3 = [s2[i] for i in keep], [e2[i] for i in keep]
    if not spaced.isascii():
        out = [(d, s, e) for c, s, e in zip(chars, s3, e3, strict=True)
               for d in unicodedata.normalize("NFD", c) if unicodedata.category(d) != "Mn"]
        chars, s3, e3 = [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]
    lo, hi = 0, len(chars)
    while lo < hi and chars[lo].isspace():
        lo += 1
    while hi > lo and chars[hi - 1].isspace():
        hi -= 1
    simple = "".join(chars[lo:hi])
    return (simple, s3[lo:hi], e3[lo:hi]) if simple == simplify_text(text) else None


def word_spans(text: str) -> tuple[list[str], list[tuple[int, int]]] | None:
    """:func:`normalized_words` of ``text`` and, per word, the character span ``[start,
    end)`` of ``text`` it comes from (a word that a number or a contraction split made
    spans the characters it came from); ``None`` when the words cannot be placed in
    ``text`` (see :func:`_simplified_with_origins`)."""
    mapped = _simplified_with_origins(text)
    if mapped is None:
        return None
    simple, starts, ends = mapped
    words = normalized_words(text)
    spans, at = [], 0
    for w in words:  # the words are substrings of the simplified text, in order
        i = simple.find(w, at)
        if i < 0:
            return None
        spans.append((starts[i], ends[i + len(w) - 1]))
        at = i + len(w)
    return words, spans
