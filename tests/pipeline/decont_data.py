"""Eval sets and training documents for the decontamination tests and benchmark, made from
the shared corpora: questions and answers are consecutive sentences of real documents,
and copies of them are planted in other documents, verbatim or changed."""

from __future__ import annotations

import re

from tests.shared import corpora
from tokenmill.pipeline.decont.text import normalized_words
from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.read.readers import read_file
from tokenmill.pipeline.read.sources import list_files
from tokenmill.pipeline.stage import Document

ALL_CORPORA = ("books-public-domain", "c4-en-sample", "cc-main-2019-sample",
               "dclm-quality-labels", "linux-docs-rst", "naughty-strings",
               "neardup-clough-stevenson", "python-docs-rst", "warc-sample",
               "wikipedia-wikitext-sample")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def corpus_texts(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(key, text)`` of every document of the corpora ``names``, read and normalized as
    a curation run does."""
    out = []
    for name in names:
        root = corpora(name)
        files = list_files(root)
        for rel in files:
            for d in read_file(root, rel, name):
                if isinstance(d, Document) and (t := normalize_text(d.text)).strip():
                    out.append((d.key, t))
    return out


def sentences(texts: list[str], min_words: int = 14, max_words: int = 40) -> list[str]:
    """The sentences of ``texts`` with ``min_words``..``max_words`` words, each of which
    is one normalized word (so that cuts by words cut n-grams), in order."""
    out = []
    for t in texts:
        for s in _SENTENCE.split(" ".join(t.split())):
            if min_words <= len(s.split()) <= max_words \
                    and len(normalized_words(s)) == len(s.split()):
                out.append(s)
    return out


def qa_examples(texts: list[str], count: int) -> list[dict[str, str]]:
    """Up to ``count`` examples ``{id, question, answer}``: two consecutive sentences."""
    sent = sentences(texts)
    return [{"id": f"ex-{i // 2:05d}", "question": sent[i], "answer": sent[i + 1]}
            for i in range(0, min(len(sent) - 1, 2 * count), 2)]


def _punctuated(text: str) -> str:
    words = text.split()
    return " ".join(w + ("," if i % 3 == 1 else ";" if i % 5 == 2 else "")
                    for i, w in enumerate(words)).replace("'", "\u2019")


def _case_and_space(text: str) -> str:
    return "\n  ".join(w.upper() if i % 2 else w.title() for i, w in enumerate(text.split()))


def planted(examples: list[dict[str, str]], hosts: list[str], n: int) -> list[tuple[str, str]]:
    """``(variant, text)``: host documents with an eval example planted in the middle,
    verbatim, with case and whitespace changes, with punctuation changes, and cut to
    ``n - 1``, ``n`` and ``n + 1`` words of the answer, or to a window that spans the
    question's end and the answer's start."""
    out = []
    for i, ex in enumerate(examples):
        host = hosts[i % len(hosts)]
        q, a = ex["question"], ex["answer"]
        aw, qw = a.split(), q.split()
        k = min(len(qw), n // 2)
        variants = {
            "verbatim": f"{q} {a}",
            "case-space": _case_and_space(f"{q} {a}"),
            "punctuation": _punctuated(f"{q} {a}"),
            "answer-n-1": " ".join(aw[:n - 1]),
            "answer-n": " ".join(aw[:n]),
            "answer-n+1": " ".join(aw[1:n + 2]),
            "overlap": " ".join(qw[len(qw) - k:] + aw[:n - k]),
            "overlap-short": " ".join(qw[len(qw) - k + 1:] + aw[:n - k]),
        }
        mid = len(host) // 2
        for name, piece in variants.items():
            out.append((name, f"{host[:mid]} {piece} {host[mid:]}"))
    return out
