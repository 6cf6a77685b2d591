"""N-gram counts model: exact counts against numpy, normalised probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from tokenmill.ngram.counts import NGramCountsModel

EOT = 50256


@pytest.fixture(scope="module")
def model(quickstart, tmp_path_factory):
    import ray

    try:
        m = NGramCountsModel.build(quickstart, orders=range(2, 9), num_cpus=2, progress=False)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    out = tmp_path_factory.mktemp("counts")
    m.save(out)
    return NGramCountsModel.load(out)


def naive_count(stream, ctx, tok):
    g = np.asarray([*ctx, tok])
    if (g[1:-1] == EOT).any():
        return 0
    w = np.lib.stride_tricks.sliding_window_view(stream, g.size)
    pos = np.flatnonzero(stream[: stream.size - g.size + 1] == g[0])
    return int((w[pos] == g).all(axis=1).sum())


def test_counts_exact(model, train_stream):
    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(2, 9))
        p = int(rng.integers(0, train_stream.size - n))
        g = train_stream[p:p + n]
        assert model.count(g[:-1].tolist(), int(g[-1])) == naive_count(
            train_stream, g[:-1], g[-1]), g


def test_probabilities_sum_to_one(model, train_stream):
    rng = np.random.default_rng(4)
    B, T = 4, 512
    starts = rng.integers(0, train_stream.size - T, size=B)
    batch = np.stack([train_stream[s:s + T] for s in starts])
    pos = np.stack([rng.integers(0, B, 100), rng.integers(0, T, 100)], axis=1)
    P = model.distribution(batch, pos)
    assert P.shape == (100, 50257)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-5)
    assert (P > 0).all()
    # the high orders carry real information: the true next token gets high probability
    ok = pos[:, 1] < T - 1
    p_true = P[np.arange(100)[ok], batch[pos[ok, 0], pos[ok, 1] + 1]]
    assert np.median(p_true) > 0.1
    # top-k agrees with the full distribution
    ids, probs = model.topk(batch, k=4)
    assert ids.shape == (B, T, 4) and probs.dtype == np.float32
    for (b, t), row in zip(pos.tolist(), P, strict=True):
        np.testing.assert_allclose(probs[b, t], row[ids[b, t]], rtol=1e-5)
        assert ids[b, t, 0] == int(np.argmax(row))


def test_context_never_crosses_documents(model):
    ctx = [EOT, 464, EOT, 464]  # EOT inside the context: only orders up to 3 apply
    a = model.distribution(np.array([[*ctx, 1]]), [[0, 3]])[0]
    b = model.distribution(np.array([[EOT, 464, 1]]), [[0, 1]])[0]
    np.testing.assert_allclose(a, b)
