"""A fastText supervised model read into arrays, and its prediction compiled with numba.

API::

    from tokenmill.pipeline.document.fasttext_model import FastTextModel
    model = FastTextModel.load(path)                  # a .bin or .ftz supervised model
    model.predict(["Ceci est une phrase ."])          # -> [("__label__fr", 0.98...)]

The prediction is fastText's own (Joulin et al., "Bag of Tricks for Efficient Text
Classification", 2016; the reading and arithmetic of fastText 0.9.2's ``Dictionary::getLine``,
``Model::computeHidden`` and ``HierarchicalSoftmaxLoss::dfs``), float for float: the
same words and character n-grams (FNV-1a hashes, the pruned n-gram index of a quantized
model), their rows summed in the same order in float32 (product-quantized rows decoded as
fastText decodes them), the same tree walk with the same pruning and logarithms. The
tests hold it to fastText's ``predict`` label for label and bit for bit on the shared
corpora. What it saves is fastText's per-word ``std::string`` building and hash-map
lookups: a batch of lines is one call with no allocation per word, and a token seen
before (the memo of :mod:`~tokenmill.pipeline.document.fasttext_kernels`) costs one hash
and its row additions.

Supported: supervised models with the hierarchical-softmax (the bundled ``lid.176.ftz``)
or softmax loss (fastText's default, the quality classifiers'), any ``wordNgrams``, an
input matrix dense or quantized (with or without norms), a dense output matrix. Anything
else (one-vs-all or negative-sampling losses, a quantized output) raises ``ValueError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.pipeline.document.fasttext_kernels import (
    ngram_slot,
    predict_all_lines,
    predict_lines,
)

_MAGIC, _VERSION = 793712314, 12
_LOSS_HS, _LOSS_NS, _LOSS_SOFTMAX, _LOSS_OVA, _MODEL_SUPERVISED = 1, 2, 3, 4, 3
_EOS = b"</s>"
_LABEL_PREFIX = b"__label__"
#: a model file larger than this is not read (lid.176.bin is 131 MB)
MAX_MODEL_BYTES = 1 << 30
#: nor one whose quantized input matrix decodes to more than this (lid.176.ftz: 3.2 MB)
MAX_DECODED_BYTES = 1 << 32


class UnsupportedModel(ValueError):
    """A sound fastText model of a kind :class:`FastTextModel` does not predict."""


@dataclass(frozen=True)
class FastTextModel:
    """The arrays of a fastText supervised model that prediction reads.

    Attributes:
        labels: label strings; index = leaf of the tree (``"__label__en"``, ...).
        weights: float32 ``[rows, dim]``: the input matrix, a quantized one decoded row
            by row as fastText adds it (``norm * centroid``, one float32 product).
        output: float32 ``[labels, dim]``: the tree's inner nodes' vectors.
        left, right: int32 ``[2 * labels - 1]``: the Huffman tree's children (-1 at
            leaves).
        vocab: the dictionary's arrays and ``[minn, maxn, bucket, eos_id]`` (see
            :mod:`~tokenmill.pipeline.document.fasttext_kernels`).
        memo: the remembered rows of tokens seen (mutable; results never depend on it).
        softmax: the loss is softmax (else hierarchical softmax).
        word_ngrams: fastText's ``wordNgrams`` (word n-grams up to this length).
    """

    labels: tuple[str, ...]
    weights: np.ndarray
    output: np.ndarray
    left: np.ndarray
    right: np.ndarray
    vocab: tuple
    memo: tuple
    softmax: bool = False
    word_ngrams: int = 1

    @classmethod
    def load(cls, path: str | Path) -> FastTextModel:
        """Read a fastText model file (never executed; sizes bounded by the file's).

        Raises:
            UnsupportedModel: a fastText model of a kind this reader does not predict
                (see the module docstring); fastText itself can.
            ValueError: not a fastText supervised model, or damaged; the message names
                the file.
        """
        size = Path(path).stat().st_size
        if size > MAX_MODEL_BYTES:
            raise UnsupportedModel(f"{path}: {size:,} bytes, more than this reader's "
                                   f"{MAX_MODEL_BYTES:,}")
        try:
            return _parse(_Reader(Path(path).read_bytes()))
        except UnsupportedModel as e:
            raise UnsupportedModel(f"{path}: {e}") from None
        except (struct.error, ValueError, IndexError) as e:
            raise ValueError(f"{path}: not a fastText classifier, or damaged ({e})") from None

    def predict(self, lines: list[str]) -> list[tuple[str, float]]:
        """Top label and its probability of each line, as fastText's ``predict(line,
        k=1)``; ``("", 0.0)`` where fastText predicts nothing.

        Args:
            lines: texts without ``"\\n"`` (fastText reads one line each).

        Raises:
            ValueError: a line holds ``"\\n"``.
            UnicodeEncodeError: a line holds a lone surrogate.
        """
        if not lines:
            return []
        found, probs = predict_lines(_lines_bytes(lines), len(lines), *self._arrays())
        return [(self.labels[i], p) if i >= 0 else ("", 0.0)
                for i, p in zip(found.tolist(), probs.tolist(), strict=True)]

    def probabilities(self, lines: list[str]) -> np.ndarray:
        """float32 ``[len(lines), len(labels)]``: each label's probability as fastText's
        ``predict(line, k=-1)`` lists it (0.0 for a label it leaves out).

        Raises:
            ValueError: a line holds ``"\\n"``.
            UnicodeEncodeError: a line holds a lone surrogate.
        """
        if not lines:
            return np.zeros((0, len(self.labels)), dtype=np.float32)
        return predict_all_lines(_lines_bytes(lines), len(lines), *self._arrays())

    def _arrays(self) -> tuple:
        return (self.weights, self.output, self.left, self.right, self.vocab, self.memo,
                self.softmax, self.word_ngrams)


def _lines_bytes(lines: list[str]) -> np.ndarray:
    return np.frombuffer(("\n".join(lines) + "\n").encode(), dtype=np.uint8)


def _new_memo(table_slots: int = 1 << 19, row_capacity: int = 1 << 22) -> tuple:
    """An empty memo: ``table_slots`` slots (half of them entries, 16 bytes of token per
    entry on average) and ``row_capacity`` rows; about 28 MB at the defaults."""
    entries = table_slots // 2
    return (np.full(table_slots, -1, dtype=np.int32), np.zeros(entries, dtype=np.int64),
            np.zeros(entries + 1, dtype=np.int64),
            np.zeros(entries * 16, dtype=np.uint8), np.zeros(entries + 1, dtype=np.int64),
            np.zeros(row_capacity, dtype=np.int32), np.zeros(1, dtype=np.int64))


class _Reader:
    """Little-endian reads from bytes; a read past the end raises ``struct.error``."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype: str, count: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if count < 0 or self.at + size > len(self.data):
            raise ValueError("an array runs past the end of the file")
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += size
        return out

    def cstring(self) -> bytes:
        end = self.data.index(b"\0", self.at)
        out, self.at = self.data[self.at:end], end + 1
        return out


def _parse(r: _Reader) -> FastTextModel:
    magic, version = r.read("ii")
    if (magic, version) != (_MAGIC, _VERSION):
        raise ValueError(f"magic/version {magic}/{version}")
    dim, _ws, _epoch, _mincount, _neg, word_ngrams, loss, model, bucket, minn, maxn, _lr = \
        r.read("12i")
    r.read("d")
    if model != _MODEL_SUPERVISED or not 1 <= word_ngrams <= 64 or not 0 < dim <= 4096 \
            or not 0 <= bucket < 1 << 31 or (bucket == 0 and (maxn > 0 or word_ngrams > 1)):
        raise ValueError(f"model {model}, wordNgrams {word_ngrams}, bucket {bucket}, "
                         f"dim {dim}: not a supervised classifier fastText can read")
    if loss in (_LOSS_NS, _LOSS_OVA):
        raise UnsupportedModel(f"loss {loss}: this reader predicts hierarchical softmax (1) "
                               "and softmax (3)")
    if loss not in (_LOSS_HS, _LOSS_SOFTMAX):
        raise ValueError(f"loss {loss}")
    words, labels, counts, prune, prune_size = _parse_dictionary(r)
    quantized, = r.read("?")
    weights = _parse_matrix(r, dim, quantized)
    qout, = r.read("?")
    if quantized and qout:  # its dot products scale by the norm last: not the decoded rows'
        raise UnsupportedModel("a quantized output matrix")
    if not all(label.startswith(_LABEL_PREFIX) for label in labels):
        # fastText keeps no label prefix in the file; a line's other-prefixed labels
        # would be read as words here
        raise UnsupportedModel(f"labels without fastText's default prefix {_LABEL_PREFIX!r}")
    output = _parse_matrix(r, dim, False)
    if output.shape[0] != len(labels):
        raise ValueError(f"{output.shape[0]} output rows for {len(labels)} labels")
    ngrams = _ngram_table(prune, prune_size, bucket, len(words), weights.shape[0])
    table, word_bytes, starts = _word_table(words)
    params = np.array([minn, maxn, bucket, words.index(_EOS) if _EOS in words else -1,
                       len(words)])
    left, right = _tree(counts)
    return FastTextModel(labels=tuple(w.decode() for w in labels), weights=weights,
                         output=output, left=left, right=right,
                         vocab=(table, word_bytes, starts, ngrams, params),
                         memo=_new_memo(), softmax=loss == _LOSS_SOFTMAX,
                         word_ngrams=word_ngrams)


def _ngram_table(prune: np.ndarray, prune_size: int, bucket: int, nwords: int, rows: int
                 ) -> np.ndarray:
    """int32 ``[2**k, 2]`` open-addressing table (linear probing from
    :func:`~tokenmill.pipeline.document.fasttext_kernels.ngram_slot`) of (n-gram bucket,
    input row) kept by a pruned model, as fastText's pushHash reads its prune index;
    ``[0, 2]`` for a model that keeps every bucket (row = words + bucket)."""
    if prune_size < 0:
        if rows < nwords + bucket:
            raise ValueError(f"{rows} input rows for {nwords} words and {bucket} buckets")
        return np.zeros((0, 2), dtype=np.int32)
    keys, values = prune[:, 0], prune[:, 1].astype(np.int64) + nwords
    if keys.size and (keys.min() < 0 or keys.max() >= bucket or values.min() < nwords
                      or values.max() >= rows):
        raise ValueError("an n-gram index outside the matrix")
    size = 16
    while size < 2 * keys.size:
        size *= 2
    table = np.full((size, 2), -1, dtype=np.int32)
    for key, value in zip(keys.tolist(), values.tolist(), strict=True):
        slot = ngram_slot(key, size - 1)
        while table[slot, 0] >= 0 and table[slot, 0] != key:
            slot = (slot + 1) & (size - 1)
        table[slot] = key, value
    return table


def _parse_dictionary(r: _Reader
                      ) -> tuple[list[bytes], list[bytes], list[int], np.ndarray, int]:
    size, nwords, nlabels = r.read("iii")
    _ntokens, prune_size = r.read("qq")
    if not (0 <= nwords and 0 < nlabels and nwords + nlabels == size <= len(r.data)):
        raise ValueError(f"dictionary of {size} entries ({nwords} words, {nlabels} labels)")
    words, labels, counts = [], [], []
    for _ in range(size):
        entry = r.cstring()
        count, kind = r.read("qb")
        (labels if kind == 1 else words).append(entry)
        if kind == 1:
            counts.append(count)
    if len(words) != nwords:
        raise ValueError("word and label counts disagree")
    prune = r.array("<i4", 2 * max(prune_size, 0)).reshape(-1, 2) if prune_size > 0 \
        else np.zeros((0, 2), dtype=np.int32)
    return words, labels, counts, prune, prune_size


def _fnv1a(word: bytes) -> int:
    """fastText's word hash: 32-bit FNV-1a over the bytes read as signed chars."""
    h = 2166136261
    for byte in word:
        h = ((h ^ (byte | 0xFFFFFF00 if byte >= 128 else byte)) * 16777619) & 0xFFFFFFFF
    return h


def _word_table(words: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Open-addressing table (linear probing from ``hash & mask``) of word ids, with the
    words' bytes to compare a hit against."""
    size = 16
    while size < 2 * len(words):
        size *= 2
    table = np.full(size, -1, dtype=np.int32)
    for wid, word in enumerate(words):
        slot = _fnv1a(word) & (size - 1)
        while table[slot] >= 0:
            slot = (slot + 1) & (size - 1)
        table[slot] = wid
    starts = np.zeros(len(words) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(w) for w in words])
    return table, np.frombuffer(b"".join(words), dtype=np.uint8).copy(), starts


def _tree(counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """fastText's Huffman tree over the labels (counts sorted descending, as its
    dictionary keeps them): leaves ``0..n-1``, root ``2n-2``, left and right children."""
    n = len(counts)
    count = np.full(2 * n - 1, 10**15, dtype=np.int64)
    count[:n] = counts
    left = np.full(2 * n - 1, -1, dtype=np.int32)
    right = np.full(2 * n - 1, -1, dtype=np.int32)
    leaf, node = n - 1, n
    for i in range(n, 2 * n - 1):
        pair = []
        for _ in range(2):
            if leaf >= 0 and count[leaf] < count[node]:
                pair.append(leaf)
                leaf -= 1
            else:
                pair.append(node)
                node += 1
        left[i], right[i] = pair
        count[i] = count[pair[0]] + count[pair[1]]
    return left, right


def _parse_matrix(r: _Reader, dim: int, quantized: bool) -> np.ndarray:
    """float32 ``[rows, dim]``; a product-quantized matrix decoded row by row as
    fastText's addcode adds it (``norm * centroid``, one float32 product each)."""
    if not quantized:
        m, n = r.read("qq")
        if n != dim or m < 0:
            raise ValueError(f"a {m}x{n} matrix for dimension {dim}")
        return r.array("<f4", m * n).reshape(m, n)
    qnorm, = r.read("?")
    m, n = r.read("qq")
    codesize, = r.read("i")
    codes = r.array("u1", codesize)
    pq_dim, nsubq, dsub, lastdsub = r.read("4i")
    if n != dim or pq_dim != dim or nsubq <= 0 or dsub <= 0 or lastdsub <= 0 \
            or codesize != m * nsubq or (nsubq - 1) * dsub + lastdsub != dim:
        raise ValueError("product quantizer does not fit the matrix")
    if m * dim * 4 > MAX_DECODED_BYTES:
        raise ValueError(f"{m:,} x {dim} quantized rows decode to more than "
                         f"{MAX_DECODED_BYTES:,} bytes")
    codes = codes.reshape(m, nsubq).astype(np.int64)
    centroids = r.array("<f4", dim * 256)
    norms = np.ones(m, dtype=np.float32)
    if qnorm:
        norm_codes = r.array("u1", m)
        if r.read("4i") != (1, 1, 1, 1):
            raise ValueError("norm quantizer is not one-dimensional")
        norms = r.array("<f4", 256)[norm_codes]
    weights = np.empty((m, dim), dtype=np.float32)
    for sub in range(nsubq):
        d = lastdsub if sub == nsubq - 1 else dsub
        first = sub * 256 * dsub + codes[:, sub:sub + 1] * d + np.arange(d)
        weights[:, sub * dsub:sub * dsub + d] = norms[:, None] * centroids[first]
    return weights
