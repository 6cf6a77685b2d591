"""FastTextModel (tokenmill.pipeline.document.fasttext_model) against the fasttext
package's own ``predict``: label for label and float for float."""

from __future__ import annotations

import struct
from pathlib import Path

import fasttext
import numpy as np
import pytest

from tests.shared import corpora
from tokenmill.pipeline.document.fasttext_kernels import predict_lines
from tokenmill.pipeline.document.fasttext_model import FastTextModel, _new_memo
from tokenmill.pipeline.document.language import fasttext_lines, fasttext_model_path
from tokenmill.pipeline.read.readers import read_file
from tokenmill.pipeline.read.sources import list_files
from tokenmill.pipeline.stage import Document

# what fastText reads in its own way: labels, a literal end-of-sentence word (fastText
# stops the line there), NUL and other separators, tokens past the memo's length,
# scripts without spaces, marks, emoji, a word repeated
EDGES = ["__label__en foo bar", "__label__xx", "a </s> der die das", "</s>", "x\0y\0z",
         "t\tab\x0bv\x0cf\rr", "漢字かな交じり文" * 40, "Ωμέγα " + "ö" * 100, "a" * 65,
         "e\u0301te\u0301 ca\u0300", "😀 🙃 👍🏽", "the " * 500, "-", "1 2 3", "<b>",
         "naïve café résumé", "Привет мир", "مرحبا بالعالم", "שלום עולם"]


def _reference(model_path: Path, lines: list[str]) -> list[tuple[str, float]]:
    ref = fasttext.load_model(str(model_path))
    labels, probs = ref.f.multilinePredict([line + "\n" for line in lines], 1, 0.0, "strict")
    return [(label[0], prob[0]) if label else ("", 0.0)
            for label, prob in zip(labels, probs, strict=True)]


def _texts(*names: str) -> list[str]:
    out = []
    for name in names:
        root = corpora(name)
        out += [d.text for rel in list_files(root)
                for d in read_file(root, rel, name) if isinstance(d, Document)]
    return out


def _assert_same(model: FastTextModel, want: list[tuple[str, float]], lines: list[str]):
    got = model.predict(lines)
    wrong = [(i, g, w, lines[i][:60]) for i, (g, w) in enumerate(zip(got, want, strict=True))
             if g != w]
    assert not wrong, f"{len(wrong)} of {len(lines)} lines differ from fastText: {wrong[:3]}"


def test_bundled_model_predicts_as_fasttext_on_real_and_edge_texts():
    """Every label and probability equals fastText's (the same float) on the C4 and
    Common Crawl samples, the naughty strings and the edge texts; again with the memo
    warm, and with a memo so small it is emptied over and over."""
    path = fasttext_model_path()
    texts = _texts("c4-en-sample", "cc-main-2019-sample", "naughty-strings") + EDGES
    lines = [line for line in fasttext_lines(texts) if line]
    want = _reference(path, lines)
    model = FastTextModel.load(path)
    _assert_same(model, want, lines)
    _assert_same(model, want, lines)
    tiny = FastTextModel(**{**model.__dict__, "memo": _new_memo(16, 64)})
    _assert_same(tiny, want, lines)
    assert {label for label, _ in want} >= {"__label__en", "__label__de", "__label__ja"}


@pytest.mark.slow  # every shared text corpus: about 40 MB through both
def test_bundled_model_predicts_as_fasttext_on_every_corpus():
    path = fasttext_model_path()
    texts = _texts("books-public-domain", "wikipedia-wikitext-sample", "linux-docs-rst",
                   "python-docs-rst", "warc-sample", "neardup-clough-stevenson")
    lines = [line for line in fasttext_lines(texts, None) if line]
    _assert_same(FastTextModel.load(path), _reference(path, lines), lines)


def _write_model(path: Path, weights: np.ndarray | None = None,
                 quantized: tuple[np.ndarray, np.ndarray] | None = None, bucket: int = 1000,
                 loss: int = 1, word_ngrams: int = 1) -> None:
    """A fastText model file in fastText's own format, with the bundled model's words,
    labels and output vectors and input rows of our choosing: dense ``weights``, or
    product-quantized (codes, centroids) without norms; every n-gram bucket kept."""
    bundled = fasttext.load_model(str(fasttext_model_path()))
    words, word_counts = bundled.get_words(include_freq=True)
    labels, label_counts = bundled.get_labels(include_freq=True)
    out = [struct.pack("<ii", 793712314, 12),
           struct.pack("<12i", 16, 5, 5, 1, 5, word_ngrams, loss, 3, bucket, 2, 4, 100),
           struct.pack("<d", 1e-4),
           struct.pack("<iiiqq", len(words) + len(labels), len(words), len(labels), 10**6, -1)]
    for entries, counts, kind in ((words, word_counts, 0), (labels, label_counts, 1)):
        out += [e.encode() + b"\0" + struct.pack("<qb", int(c), kind)
                for e, c in zip(entries, counts, strict=True)]
    if quantized is None:
        out += [struct.pack("<?qq", False, *weights.shape), weights.astype("<f4").tobytes()]
    else:
        codes, centroids = quantized
        out += [struct.pack("<??qqi", True, False, codes.shape[0], 16, codes.size),
                codes.astype(np.uint8).tobytes(), struct.pack("<4i", 16, 8, 2, 2),
                centroids.astype("<f4").tobytes()]
    output = FastTextModel.load(fasttext_model_path()).output
    out += [struct.pack("<?qq", False, *output.shape), output.astype("<f4").tobytes()]
    path.write_bytes(b"".join(out))


def test_a_dense_and_a_quantized_model_without_norms_predict_as_fasttext(tmp_path):
    """Models that keep every n-gram bucket, with a dense input matrix and with a
    product-quantized one without norms (random rows): the same predictions as fastText
    loading the same file."""
    rng = np.random.default_rng(7)
    rows = len(fasttext.load_model(str(fasttext_model_path())).words) + 1000
    _write_model(tmp_path / "dense.bin", weights=rng.normal(0, 0.3, (rows, 16)))
    _write_model(tmp_path / "quant.ftz", quantized=(rng.integers(0, 256, (rows, 8)),
                                                    rng.normal(0, 0.3, 16 * 256)))
    texts = _texts("c4-en-sample")[:200] + EDGES
    lines = [line for line in fasttext_lines(texts) if line]
    for name in ("dense.bin", "quant.ftz"):
        _assert_same(FastTextModel.load(tmp_path / name), _reference(tmp_path / name, lines),
                     lines)


def test_models_it_does_not_predict_and_damaged_files_raise_one_line(tmp_path):
    """A negative-sampling model, a truncated, a foreign and an empty file, a dictionary
    that claims two billion entries and codes that would decode to 4.9 GB: ``ValueError``
    naming the file, never an unbounded read or allocation."""
    rows = len(fasttext.load_model(str(fasttext_model_path())).words) + 1000
    _write_model(tmp_path / "sampled.bin", weights=np.zeros((rows, 16)), loss=2)
    good = fasttext_model_path().read_bytes()
    (tmp_path / "cut.ftz").write_bytes(good[:len(good) // 2])
    (tmp_path / "foreign.bin").write_bytes(b"PK\x03\x04" + bytes(100))
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "huge.bin").write_bytes(good[:64] + struct.pack("<iii", 2**31 - 1, 2**31 - 2, 1)
                                        + good[76:200])
    (tmp_path / "bomb.ftz").write_bytes(_bomb())
    for name in ("bomb.ftz", "sampled.bin", "cut.ftz", "foreign.bin", "empty.bin", "huge.bin"):
        with pytest.raises(ValueError, match=name) as e:
            FastTextModel.load(tmp_path / name)
        assert "\n" not in str(e.value)


def _bomb() -> bytes:
    """A quantized model of 300,000 rows of one 4096-dimensional sub-quantizer: 300 KB of
    codes that would decode to 4.9 GB of float32."""
    rows, dim = 300_000, 4096
    return b"".join([
        struct.pack("<ii", 793712314, 12),
        struct.pack("<12i", dim, 5, 5, 1, 5, 1, 1, 3, 1000, 2, 4, 100), struct.pack("<d", 1e-4),
        struct.pack("<iiiqq", 2, 1, 1, 10, -1),
        b"</s>\0" + struct.pack("<qb", 5, 0), b"__label__a\0" + struct.pack("<qb", 5, 1),
        struct.pack("<??qqi", True, False, rows, dim, rows), bytes(rows),
        struct.pack("<4i", dim, 1, dim, dim)])


def test_the_kernel_refuses_lines_that_do_not_end():
    model = FastTextModel.load(fasttext_model_path())
    data = np.frombuffer(b"no newline", dtype=np.uint8)
    with pytest.raises(ValueError, match="ended by a newline"):
        predict_lines(data, 1, model.weights, model.output, model.left, model.right,
                      model.vocab, model.memo)


def _trained(tmp_path: Path) -> Path:
    """A model fastText trains (softmax, word bigrams, as ``tokenmill classifier train``)
    on 300 C4 texts labelled alternately, in a process of its own (see tests.tinymodel)."""
    import gzip
    import json

    from tests.tinymodel import train_tiny_model

    f = sorted(corpora("c4-en-sample", "data").glob("*.json.gz"))[0]
    with gzip.open(f, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line)["text"] for _, line in zip(range(300), fh, strict=False)]
    lines = [f"__label__{'hq' if i % 3 else 'cc'} {' '.join(t.split())}"
             for i, t in enumerate(rows)]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    train_tiny_model(tmp_path / "train.txt", tmp_path / "model.bin", dim=16, bucket=5000)
    return tmp_path / "model.bin"


def _all_labels(path: Path, lines: list[str]) -> np.ndarray:
    ref = fasttext.load_model(str(path))
    labels, probs = ref.predict(lines, k=-1)
    out = np.zeros((len(lines), len(ref.labels)), dtype=np.float64)
    for row, (labs, ps) in enumerate(zip(labels, probs, strict=True)):
        for lab, p in zip(labs, ps, strict=True):
            out[row, ref.labels.index(lab)] = p
    return out


def test_crafted_softmax_models_with_word_ngrams_predict_as_fasttext(tmp_path):
    """Softmax with word bi- and trigrams over random dense and quantized rows (every
    bucket kept): the top label and every label's probability equal fastText's."""
    rng = np.random.default_rng(11)
    rows = len(fasttext.load_model(str(fasttext_model_path())).words) + 1000
    _write_model(tmp_path / "dense.bin", weights=rng.normal(0, 0.5, (rows, 16)), loss=3,
                 word_ngrams=2)
    _write_model(tmp_path / "quant.ftz", quantized=(rng.integers(0, 256, (rows, 8)),
                                                    rng.normal(0, 0.5, 16 * 256)),
                 loss=3, word_ngrams=3)
    lines = [line for line in fasttext_lines(_texts("c4-en-sample")[:150] + EDGES) if line]
    for name in ("dense.bin", "quant.ftz"):
        model = FastTextModel.load(tmp_path / name)
        _assert_same(model, _reference(tmp_path / name, lines), lines)
        assert np.array_equal(model.probabilities(lines).astype(np.float64),
                              _all_labels(tmp_path / name, lines)), name


def test_a_trained_classifier_and_its_quantized_copy_predict_as_fasttext(tmp_path):
    """A model as ``tokenmill classifier train`` makes them (softmax, word bigrams), and
    the same quantized with norms and pruned: the top label and every label's
    probability equal fastText's ``predict`` (k = 1 and k = -1)."""
    lines = [" ".join(t.split()) or "x" for t in _texts("c4-en-sample")[300:500] + EDGES]
    trained = _trained(tmp_path)
    quantized = fasttext.load_model(str(trained))
    quantized.quantize(input=str(tmp_path / "train.txt"), qnorm=True, retrain=False,
                       cutoff=2000)
    quantized.save_model(str(tmp_path / "quantized.ftz"))
    for path in (trained, tmp_path / "quantized.ftz"):
        model = FastTextModel.load(path)
        _assert_same(model, _reference(path, lines), lines)
        got = model.probabilities(lines).astype(np.float64)
        assert np.array_equal(got, _all_labels(path, lines)), path.name


def test_the_classifier_stage_scores_as_fasttext_and_falls_back_for_other_losses(tmp_path):
    """The classifier stage's scores are fastText's; a one-vs-all model (a loss the compiled
    prediction does not have) is scored by fastText itself."""
    from tokenmill.pipeline.document.classifier import FastTextOwn, label_scores, load_model

    texts = _texts("c4-en-sample")[300:400]
    lines = [" ".join(t.split()) for t in texts]
    ova = tmp_path / "ova.bin"
    rows = len(fasttext.load_model(str(fasttext_model_path())).words) + 1000
    _write_model(ova, weights=np.random.default_rng(3).normal(0, 0.5, (rows, 16)), loss=4)
    for path, kind in ((_trained(tmp_path), FastTextModel), (ova, FastTextOwn)):
        model = load_model(str(path))
        assert isinstance(model, kind)
        label = fasttext.load_model(str(path)).labels[0]
        want = _all_labels(path, lines)[:, 0]
        assert label_scores(model, lines, label) == [min(1.0, p) for p in want.tolist()]
