"""fastText quality classifier stage: score every document, keep the good ones.

API::

    from tokenmill.pipeline.document.classifier import ClassifierFilter, prepare_text
    stage = ClassifierFilter(model="model.bin", label="hq", threshold=0.5)
    kept = list(stage(docs))   # every document gets metadata["classifier_score"]

Models (fastText supervised classifiers, ``.bin`` or quantized ``.ftz``; Joulin et al.,
"Bag of Tricks for Efficient Text Classification", 2016) and the text preparation each
needs (``text_prep``):

* DCLM's ``openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin`` (Li et al., "DataComp-LM",
  2024; labels ``hq``/``cc``): ``dclm``, as DCLM's ``classify_fasttext_hq_prob`` prepares a
  document: stripped, its lines joined by single spaces, case kept (DCLM's inference code
  does not lower-case).
* a model of ``tokenmill classifier train``: ``dclm`` (it trains on text prepared so).
* a model trained on lower-cased text (fastText's supervised tutorial preprocessing):
  ``lower`` (``dclm``, then lower-cased).
* ``none``: only newlines to spaces (fastText predicts one line).

FineWeb-Edu's classifier is a BERT regression head (``HuggingFaceFW/fineweb-edu-classifier``),
not a fastText model: it does not load here.

The score is the model's probability of ``label`` (all labels predicted, ``k=-1``), rounded
to 4 digits, in ``metadata["classifier_score"]`` (shard sidecar) and, for a removed
document, in its quarantine ``detail``. With ``threshold`` a document scoring below it is
removed (``classifier:below_threshold``); with ``top_fraction`` the stage only scores and
:class:`~tokenmill.pipeline.document.classifier_top.ClassifierTopFraction` (a global stage,
after dedup) keeps the best-scored share of each source. The model is loaded once per
worker process and predicted by
:class:`~tokenmill.pipeline.document.fasttext_model.FastTextModel` (fastText's own
arithmetic compiled, the same scores); a model of another loss (one-vs-all, negative
sampling) by fastText itself.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from tokenmill import objectcache
from tokenmill.pipeline.document.fasttext_model import FastTextModel, UnsupportedModel
from tokenmill.pipeline.stage import Document, DocumentStage

TEXT_PREPS = ("dclm", "lower", "none")
LABEL_PREFIX = "__label__"


def prepare_text(text: str, prep: str = "dclm", max_chars: int | None = None) -> str:
    """``text`` as the model's authors prepared theirs (see the module docstring).

    Raises:
        ValueError: unknown ``prep``.
    """
    if max_chars is not None:
        text = text[:max_chars]
    if prep == "none":
        return text.replace("\n", " ")
    if prep not in TEXT_PREPS:
        raise ValueError(f"unknown text_prep {prep!r}; known: {TEXT_PREPS}")
    line = " ".join(text.strip().splitlines())
    return line.lower() if prep == "lower" else line


@functools.lru_cache(maxsize=2)
def load_model(path: str, digest: str = ""):
    """The fastText model at ``path``, loaded once per process (``digest``: of its bytes,
    so a replaced file is loaded again): a :class:`FastTextModel` (fastText's prediction
    compiled, float for float), or fastText's own model for a kind it does not predict
    (one-vs-all or negative-sampling losses, a quantized output matrix, over 1 GiB).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a fastText model.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"classifier model {path} not found")
    try:
        return FastTextModel.load(path)
    except UnsupportedModel:
        pass  # a sound model of another kind: fastText's own prediction
    except ValueError as e:  # damaged: fastText would read it silently, or crash
        raise ValueError(f"classifier model {e}") from None
    import fasttext

    try:
        return FastTextOwn(fasttext.load_model(path))
    except Exception as e:  # fastText raises bare ValueError/RuntimeError
        raise ValueError(f"classifier model {path}: not a fastText model ({e})") from None


class FastTextOwn:
    """A model of the ``fasttext`` package behind :class:`FastTextModel`'s interface
    (``labels``, ``probabilities``), predicted by fastText itself."""

    def __init__(self, model) -> None:
        self.model = model
        self.labels = tuple(model.get_labels())

    def probabilities(self, lines: list[str]) -> np.ndarray:
        """float32 ``[len(lines), len(labels)]`` from ``predict(lines, k=-1)`` (0.0 for a
        label it leaves out)."""
        out = np.zeros((len(lines), len(self.labels)), dtype=np.float32)
        labels, probs = self.model.predict(lines, k=-1)
        for row, (labs, ps) in enumerate(zip(labels, probs, strict=True)):
            out[row, [self.labels.index(lab) for lab in labs]] = ps
        return out


def label_scores(model: FastTextModel | FastTextOwn, lines: list[str], label: str
                 ) -> list[float]:
    """Probability of ``label`` for each prepared line (0.0 when the model never predicts
    it, e.g. an empty line), as fastText's ``predict(lines, k=-1)`` gives it."""
    want = label if label.startswith(LABEL_PREFIX) else LABEL_PREFIX + label
    if want not in model.labels:
        return [0.0] * len(lines)
    column = model.probabilities(lines)[:, model.labels.index(want)]
    return [min(1.0, p) for p in column.tolist()]


def check_label(model: FastTextModel | FastTextOwn, label: str, path: str) -> None:
    """Raise ``ValueError`` when the model has no ``label``."""
    want = label if label.startswith(LABEL_PREFIX) else LABEL_PREFIX + label
    if want not in model.labels:
        known = [lab.removeprefix(LABEL_PREFIX) for lab in model.labels]
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10:,} more" if len(known) > 10
                                         else "")
        raise ValueError(f"classifier model {path} has no label {label!r}; its labels: "
                         f"{shown}")


class ClassifierFilter(DocumentStage):
    """Score documents with a fastText model; with ``threshold``, remove the low ones.

    Args:
        model: model file; digest: sha256 of its bytes (part of the fingerprint).
        label: the label scored (with or without ``__label__``).
        threshold: keep documents scoring at least this (None: only score).
        text_prep: ``dclm``, ``lower`` or ``none``; max_chars: characters scored.
        batch: documents per ``predict`` call.

    Raises:
        ValueError: unknown text_prep, or a model without ``label`` (on the first block).
    """

    name = "classifier"
    version = 1

    def __init__(self, model: str, label: str, threshold: float | None = None,
                 text_prep: str = "dclm", max_chars: int | None = None, digest: str = "",
                 batch: int = 256) -> None:
        if text_prep not in TEXT_PREPS:
            raise ValueError(f"unknown text_prep {text_prep!r}; known: {TEXT_PREPS}")
        # the model's bytes, not its path, are the config
        super().__init__(label=label, threshold=threshold, text_prep=text_prep,
                         max_chars=max_chars, digest=digest)
        self.model_path, self.digest, self.label = model, digest, label
        self.threshold, self.text_prep, self.max_chars = threshold, text_prep, max_chars
        self.batch = batch

    def _scored(self, docs: list[Document]) -> list[float]:
        # a model given by URL (an output in an object store): this node's copy of it
        model = load_model(objectcache.node_file(self.model_path), self.digest)
        check_label(model, self.label, self.model_path)
        lines = [prepare_text(d.text, self.text_prep, self.max_chars) for d in docs]
        return label_scores(model, lines, self.label)

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        batch: list[Document] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) == self.batch:
                yield from self._decide(batch)
                batch = []
        if batch:
            yield from self._decide(batch)

    def _decide(self, docs: list[Document]) -> Iterator[Document]:
        for doc, score in zip(docs, self._scored(docs), strict=True):
            doc.metadata["classifier_score"] = round(score, 4)
            if self.threshold is not None and score < self.threshold:
                self.reject(doc, "classifier:below_threshold", detail=f"{score:.4f}")
            else:
                yield doc
