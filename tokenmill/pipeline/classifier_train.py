"""``tokenmill classifier train``: a fastText quality classifier from positive and negative
documents, as DCLM (Li et al., "DataComp-LM", 2024) and Marin train theirs.

API::

    from tokenmill.pipeline.classifier_train import TrainParams, read_texts, train_and_evaluate
    pos, neg = read_texts(["good.jsonl"]), read_texts(["bad.jsonl"])
    result = train_and_evaluate(pos, neg, TrainParams(), folds=5)

Hyperparameters: fastText's supervised defaults with word bigrams (``wordNgrams=2``), as
DCLM's classifier (``lr=0.1``, ``dim=100``, ``epoch=5``, ``minCount=1``, softmax loss); one
training thread and a fixed seed, so the same documents give the same model. Text is
prepared with :func:`~tokenmill.pipeline.document.classifier.prepare_text` (``dclm`` by
default: what the classifier stage then uses). Labels ``__label__hq`` / ``__label__cc``
(DCLM's names).

Held-out split: a document is held out when its prepared text's sha256, as an integer
modulo ``folds``, is 0 (``folds=5``: about a fifth), so it does not depend on input order.
With ``cv=True`` every fold is held out in turn (k-fold cross-validation) and the mean
held-out metrics are printed as well. Metrics on the held-out documents: precision and
recall of the positive label at probability 0.5, and ROC AUC of its probability
(Mann-Whitney U, ties counted half).

Sources: ``PATH`` (a data file or a folder of them: every row tokenmill's readers read) or
``PATH:FIELD=VALUE`` (JSON Lines rows whose ``FIELD`` equals ``VALUE``, e.g.
``labels.jsonl:label=1``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenmill.pipeline.document.classifier import FastTextOwn, label_scores, prepare_text
from tokenmill.pipeline.read.readers import is_data_file, read_file
from tokenmill.pipeline.stage import Document

POSITIVE, NEGATIVE = "hq", "cc"


@dataclass(frozen=True)
class TrainParams:
    """fastText supervised training parameters (DCLM's: defaults with bigrams)."""

    lr: float = 0.1
    dim: int = 100
    epoch: int = 5
    wordNgrams: int = 2  # noqa: N815 (fastText's name)
    minCount: int = 1  # noqa: N815
    bucket: int = 2_000_000
    seed: int = 42
    thread: int = 1


@dataclass(frozen=True)
class Metrics:
    """Held-out precision and recall of the positive label at 0.5, and ROC AUC."""

    precision: float
    recall: float
    auc: float
    n: int


def _rows_where(path: Path, field: str, value: str) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {i + 1}: not JSON ({e.msg})") from None
            if isinstance(row, dict) and str(row.get(field)) == value \
                    and isinstance(row.get("text"), str):
                out.append(row["text"])
    return out


def read_texts(sources: Sequence[str]) -> list[str]:
    """The texts of ``sources`` (see the module docstring), in order.

    Raises:
        FileNotFoundError: a source path does not exist.
        ValueError: a ``PATH:FIELD=VALUE`` file with a row that is not JSON.
    """
    texts: list[str] = []
    for src in sources:
        path, _, where = src.partition(":") if ":" in src and "=" in src else (src, "", "")
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"classifier train: {path}: no such file or folder")
        if where:
            field, _, value = where.partition("=")
            texts += _rows_where(p, field, value)
            continue
        files = [p] if p.is_file() else sorted(
            q for q in p.rglob("*") if q.is_file() and is_data_file(q.name)
            and q.name != "README.md")
        for f in files:
            texts += [d.text for d in read_file(f.parent, f.name, "train")
                      if isinstance(d, Document)]
    return texts


def fold_of(line: str, folds: int) -> int:
    """The fold of a prepared text: its sha256 as an integer modulo ``folds``."""
    return int.from_bytes(hashlib.sha256(line.encode("utf-8", "surrogatepass")).digest()[:8],
                          "little") % folds


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC (Mann-Whitney U over average ranks); NaN without both classes."""
    pos, neg = int(labels.sum()), int((1 - labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):  # average ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def metrics(scores: np.ndarray, labels: np.ndarray) -> Metrics:
    """:class:`Metrics` of positive-label probabilities ``scores`` against 0/1 ``labels``."""
    pred = scores >= 0.5
    tp = int((pred & (labels == 1)).sum())
    return Metrics(precision=tp / max(1, int(pred.sum())), recall=tp / max(1, int(labels.sum())),
                   auc=roc_auc(scores, labels), n=len(labels))


def fit(lines: Sequence[str], labels: Sequence[int], params: TrainParams):
    """A fastText model trained on prepared ``lines`` with 0/1 ``labels``.

    Raises:
        RuntimeError: the installed ``fasttext`` module cannot train (fasttext-predict).
    """
    import fasttext

    if not hasattr(fasttext, "train_supervised"):
        raise RuntimeError("the installed fasttext module cannot train: install "
                           "fasttext-numpy2 (pip install --force-reinstall fasttext-numpy2)")
    fd, name = tempfile.mkstemp(suffix=".txt", prefix="tokenmill-fasttext-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
            for line, y in zip(lines, labels, strict=True):
                f.write(f"__label__{POSITIVE if y else NEGATIVE} {line}\n")
        return fasttext.train_supervised(input=name, verbose=0, **asdict(params))
    finally:
        os.unlink(name)


def evaluate(model, lines: Sequence[str], labels: Sequence[int]) -> Metrics:
    """Held-out :class:`Metrics` of ``model`` on prepared ``lines``."""
    scores = np.array(label_scores(FastTextOwn(model), list(lines), POSITIVE))
    return metrics(scores, np.array(labels, dtype=np.int64))


#: the heuristic filters whose keep decision is the baseline AUC (published thresholds)
BASELINE_FILTERS = ("gopher_quality", "gopher_repetition", "c4", "fineweb")


def heuristic_keep(texts: Sequence[str]) -> np.ndarray:
    """1.0 where tokenmill's Gopher, C4 and FineWeb filters (published thresholds, c4 not
    modifying text) all keep the document, else 0.0."""
    from tokenmill.pipeline.document.quality import build_quality_filter

    filters = [build_quality_filter(n, **({"modify_text": False} if n == "c4" else {}))
               for n in BASELINE_FILTERS]
    out = np.ones(len(texts))
    for i, t in enumerate(texts):
        doc = Document(key=f"train/x#{i}", source="train", text=t)
        out[i] = float(all(f.reason(doc) is None for f in filters))
    return out


@dataclass
class TrainResult:
    """What :func:`train_and_evaluate` measured, and the final model."""

    model: object
    held_out: Metrics
    baseline_auc: float
    n_train: int
    cv: list[Metrics]
    cv_baseline_auc: list[float]


def train_and_evaluate(positive: Sequence[str], negative: Sequence[str], params: TrainParams,
                       folds: int = 5, cv: bool = False, text_prep: str = "dclm") -> TrainResult:
    """Train on every fold but the held-out one (fold 0), evaluate on it; with ``cv`` also
    every fold in turn.

    Raises:
        ValueError: no positive or no negative document, or ``folds < 2``.
    """
    if not positive or not negative:
        raise ValueError("classifier train: needs positive and negative documents (got "
                         f"{len(positive)} positive, {len(negative)} negative)")
    if folds < 2:
        raise ValueError(f"classifier train: --folds must be at least 2, got {folds}")
    texts = [*positive, *negative]
    lines = [prepare_text(t, text_prep) for t in texts]
    labels = np.array([1] * len(positive) + [0] * len(negative))
    fold = np.array([fold_of(line, folds) for line in lines])
    keep = heuristic_keep(texts)

    def run(k: int) -> tuple[object, Metrics, float]:
        tr, te = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        model = fit([lines[i] for i in tr], labels[tr].tolist(), params)
        return model, evaluate(model, [lines[i] for i in te], labels[te].tolist()), \
            roc_auc(keep[te], labels[te])

    per_fold = [run(k) for k in range(folds)] if cv else [run(0)]
    model, held, base = per_fold[0]
    return TrainResult(model, held, base, int((fold != 0).sum()),
                       [m for _, m, _ in per_fold] if cv else [],
                       [b for _, _, b in per_fold] if cv else [])


def summary_lines(r: TrainResult, folds: int) -> list[str]:
    """The lines ``tokenmill classifier train`` prints."""
    def m(x: Metrics) -> str:
        return f"precision {x.precision:.3f}  recall {x.recall:.3f}  AUC {x.auc:.3f}"

    lines = [f"trained on {r.n_train} documents; held out {r.held_out.n} (fold 0 of {folds})",
             f"held-out: {m(r.held_out)}",
             f"held-out AUC of the heuristic filters' keep decision ({', '.join(BASELINE_FILTERS)}"
             f"): {r.baseline_auc:.3f}"]
    if r.cv:
        mean = Metrics(*(float(np.mean([getattr(x, f) for x in r.cv]))
                         for f in ("precision", "recall", "auc")), n=sum(x.n for x in r.cv))
        lines += [f"{folds}-fold cross-validation, mean held-out: {m(mean)}",
                  f"{folds}-fold cross-validation, mean held-out AUC of the heuristic filters' "
                  f"keep decision: {float(np.mean(r.cv_baseline_auc)):.3f}"]
    return lines


def _train_command(args) -> int:
    import dataclasses

    from tokenmill.atomic import atomic_open

    out = Path(args.output)
    if out.suffix not in (".bin", ".ftz"):
        raise ValueError(f"classifier train: -o {out}: the model file must end in .bin (or "
                         ".ftz, quantized)")
    params = dataclasses.replace(TrainParams(), lr=args.lr, epoch=args.epoch, dim=args.dim,
                                 wordNgrams=args.word_ngrams, bucket=args.bucket)
    r = train_and_evaluate(read_texts(args.positive), read_texts(args.negative), params,
                           folds=args.folds, cv=args.cv, text_prep=args.text_prep)
    for line in summary_lines(r, args.folds):
        print(line)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".ftz":
        r.model.quantize(qnorm=True, retrain=False)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        r.model.save_model(str(Path(tmp) / out.name))  # fastText writes to a path
        with open(Path(tmp) / out.name, "rb") as src, atomic_open(out) as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    print(f"wrote {out} (label {POSITIVE!r}, text_prep {args.text_prep!r})")
    return 0


def add_classifier_parser(sub) -> None:
    """``tokenmill classifier train``."""
    from tokenmill.cliargs import add_output_argument

    group = sub.add_parser("classifier", help="train fastText quality classifiers")
    csub = group.add_subparsers(dest="classifier_command", required=True, metavar="COMMAND",
                                help="the classifier command to run")
    p = csub.add_parser("train", help="train a fastText classifier of positive against "
                        "negative documents; print held-out precision, recall and AUC")
    p.add_argument("--positive", nargs="+", required=True, metavar="SRC",
                   help="good documents: data files or folders, or FILE.jsonl:FIELD=VALUE")
    p.add_argument("--negative", nargs="+", required=True, metavar="SRC",
                   help="bad documents (same forms)")
    add_output_argument(p, help="model file (.bin; .ftz: quantized)", required=True,
                        metavar="MODEL")
    p.add_argument("--folds", type=int, default=5, help="held-out split: one fold of this "
                   "many (by text hash)")
    p.add_argument("--cv", action="store_true", help="also cross-validate over every fold")
    p.add_argument("--text-prep", default="dclm", choices=("dclm", "lower", "none"),
                   help="text preparation (the classifier stage's text_prep)")
    d = TrainParams()
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate")
    p.add_argument("--epoch", type=int, default=d.epoch, help="epochs")
    p.add_argument("--dim", type=int, default=d.dim, help="vector size")
    p.add_argument("--word-ngrams", type=int, default=d.wordNgrams, help="word n-grams")
    p.add_argument("--bucket", type=int, default=d.bucket, help="hash buckets of the n-grams "
                   "(the model holds bucket x dim floats: 2,000,000 x 100 is 800 MB)")
    p.set_defaults(func=_train_command)
