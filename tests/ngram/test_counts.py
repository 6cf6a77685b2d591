"""N-gram counts model: exact counts against brute force, compact on disk, normalised
probabilities, the same answers whether a context's followers are stored or read from the
suffix array."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenmill.ngram.counts import NGramCountsModel, build_counts
from tokenmill.ngram.index import SuffixArrayIndex, build_index

EOT = 50256


@pytest.fixture(scope="module")
def index(quickstart, tmp_path_factory) -> SuffixArrayIndex:
    out = tmp_path_factory.mktemp("counts_index")
    build_index(quickstart, out, progress=False)
    return SuffixArrayIndex(out)


@pytest.fixture(scope="module")
def built(index):
    """Saved and loaded back, with its build summary."""
    s = build_counts(index, index.folder / "counts", orders=range(2, 9))
    return NGramCountsModel.load(index.folder / "counts"), s


@pytest.fixture(scope="module")
def model(built):
    return built[0]


@pytest.fixture(scope="module")
def sparse(index):
    """Followers stored only for contexts seen >= 64 times: most answers come from the SA."""
    return NGramCountsModel.build(index, orders=range(2, 9), min_count=64)


@pytest.fixture(scope="module")
def stream(index) -> np.ndarray:
    """The indexed tokens as the counts see them: the part's sentinel is the last
    document's end, i.e. EOT (int64)."""
    s = np.asarray(index.tokens).astype(np.int64)
    s[s == index.sentinel] = EOT
    return s


def naive_count(stream, ctx, tok):
    g = np.asarray([*ctx, tok])
    if (g[1:-1] == EOT).any():
        return 0
    w = np.lib.stride_tricks.sliding_window_view(stream, g.size)
    pos = np.flatnonzero(stream[: stream.size - g.size + 1] == g[0])
    return int((w[pos] == g).all(axis=1).sum())


def test_counts_exact(model, sparse, stream):
    rng = np.random.default_rng(3)
    for i in range(150):
        n = int(rng.integers(2, 9))
        p = int(rng.integers(0, stream.size - n))
        g = stream[p:p + n].copy()
        if i % 3 == 1:  # a seen context with another follower (mostly count 0 or 1)
            g[-1] = int(rng.integers(0, EOT))
        if i % 3 == 2:  # the end of a document
            g[-1] = EOT
        want = naive_count(stream, g[:-1], g[-1])
        assert model.count(g[:-1].tolist(), int(g[-1])) == want, g
        assert sparse.count(g[:-1].tolist(), int(g[-1])) == want, g
    last = stream[-4:-1].tolist()  # the very last document ends at the part's sentinel
    assert model.count(last, EOT) == naive_count(stream, last, EOT) >= 1
    with pytest.raises(ValueError, match="order 10"):
        model.count([1] * 9, 2)


def test_counts_are_compact(built, index):
    model, s = built
    index_bytes = sum((index.folder / n).stat().st_size
                      for n in ("tokens.bin", "sa.bin", "docs.parquet"))
    on_disk = sum(f.stat().st_size for f in (index.folder / "counts").iterdir())
    assert s["bytes"] == on_disk
    assert on_disk <= 8 * index_bytes, (on_disk, index_bytes)
    assert s["contexts"][2] > 1000 and set(s["followers"]) == set(range(2, 9))


def test_probabilities_sum_to_one(model, sparse, stream):
    rng = np.random.default_rng(4)
    B, T = 4, 256
    starts = rng.integers(0, stream.size - T, size=B)
    batch = np.stack([stream[s:s + T] for s in starts])
    pos = np.stack([rng.integers(0, B, 60), rng.integers(0, T, 60)], axis=1)
    P = model.distribution(batch, pos)
    assert P.shape == (60, 50257)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-5)
    assert (P > 0).all()
    np.testing.assert_allclose(sparse.distribution(batch, pos), P, rtol=1e-12)
    # the high orders carry real information: the true next token gets high probability
    ok = pos[:, 1] < T - 1
    p_true = P[np.arange(60)[ok], batch[pos[ok, 0], pos[ok, 1] + 1]]
    assert np.median(p_true) > 0.1
    # top-k agrees with the full distribution
    ids, probs = model.topk(batch, k=4)
    assert ids.shape == (B, T, 4) and probs.dtype == np.float32
    for (b, t), row in zip(pos.tolist(), P, strict=True):
        np.testing.assert_allclose(probs[b, t], row[ids[b, t]], rtol=1e-5)
        assert ids[b, t, 0] == int(np.argmax(row))
    ids2, probs2 = sparse.topk(batch, k=4)  # candidates: a superset (all rare followers)
    assert (probs2 >= probs * (1 - 1e-5)).all()
    for (b, t), row in zip(pos.tolist(), P, strict=True):
        assert ids2[b, t, 0] == int(np.argmax(row))
    tok, p = model.next_tokens(batch[0, :10].tolist(), k=3)
    np.testing.assert_array_equal(tok, ids[0, 9, :3])


def test_context_never_crosses_documents(model):
    ctx = [EOT, 464, EOT, 464]  # EOT inside the context: only orders up to 3 apply
    a = model.distribution(np.array([[*ctx, 1]]), [[0, 3]])[0]
    b = model.distribution(np.array([[EOT, 464, 1]]), [[0, 1]])[0]
    np.testing.assert_allclose(a, b)


def test_several_parts_count_exactly(quickstart, tmp_path, stream):
    build_index(quickstart, tmp_path / "idx", progress=False, max_part_tokens=700_000)
    idx = SuffixArrayIndex(tmp_path / "idx")
    assert idx.parts.size > 3
    m = NGramCountsModel.build(idx, orders=[2, 3, 5])
    rng = np.random.default_rng(5)
    for _ in range(60):
        n = int(rng.choice([2, 3, 5]))
        p = int(rng.integers(0, stream.size - n))
        g = stream[p:p + n]
        assert m.count(g[:-1].tolist(), int(g[-1])) == idx.count(g.tolist()), g


def test_bad_options_and_files(index, built, tmp_path):
    with pytest.raises(ValueError, match=r"orders must lie in 2\.\.32"):
        NGramCountsModel.build(index, orders=range(2, 99))
    with pytest.raises(ValueError, match="min_count"):
        NGramCountsModel.build(index, min_count=1)
    folder = index.folder / "counts"
    meta = json.loads((folder / "counts.json").read_text())
    old = tmp_path / "old"
    old.mkdir()
    (old / "counts.json").write_text(json.dumps({**meta, "format": "tokenmill-ngram-counts/1"}))
    with pytest.raises(ValueError, match="rebuild"):
        NGramCountsModel.load(old)
    with pytest.raises(ValueError, match="missing"):
        NGramCountsModel.load(tmp_path / "nothing")
