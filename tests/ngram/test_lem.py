"""Online causal LEM predictor against the brute-force oracle, and LEMStream."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tokenmill.ngram.lem import OnlineLEM, lem_oracle
from tokenmill.ngram.stream import LEMStream

EOT = 50256
N = 200_000


def run(tokens, mode, step, k=3, window=0, chunks=None):
    lem = OnlineLEM(EOT, k=k, mode=mode, window=window)
    if mode == "step":
        parts = [tokens[i:i + step] for i in range(0, tokens.size, step)]
    else:  # position mode: chunking must not matter
        parts = np.array_split(tokens, chunks or 7)
    res = [lem.step(p) for p in parts]
    return np.concatenate([r[0] for r in res]), np.concatenate([r[1] for r in res])


@pytest.fixture(scope="module")
def first(train_stream):
    return np.ascontiguousarray(train_stream[:N])


@pytest.mark.parametrize("mode,step,window", [
    ("position", 0, 0), ("step", 4096, 0), ("position", 0, 30_000), ("step", 1000, 30_000),
])
def test_matches_bruteforce_oracle(first, mode, step, window):
    got_len, got_next = run(first, mode, step, window=window)
    want_len, want_next = lem_oracle(first, EOT, 3, step, window // 2)
    np.testing.assert_array_equal(got_len, want_len)
    np.testing.assert_array_equal(got_next, want_next)
    assert want_len.max() > 20 and (want_next[:, 1] >= 0).sum() > N // 4  # non-trivial
    if mode == "step":  # nothing from the current step: the first step sees nothing
        assert (got_len[:step] == 0).all()


@pytest.mark.parametrize("mode", ["position", "step"])
def test_causal_and_within_documents(first, mode):
    x = first[:60_000]
    base_len, base_next = run(x, mode, 2000)
    # changing tokens from position m on never changes the answers before m
    for m in (7_001, 31_337, 50_000):
        y = x.copy()
        y[m:] = np.random.default_rng(m).integers(0, EOT, size=x.size - m)
        ln, nx = run(y, mode, 2000)
        np.testing.assert_array_equal(ln[:m], base_len[:m])
        np.testing.assert_array_equal(nx[:m], base_next[:m])
    # never longer than the current document (EOT at most as the first matched token)
    docstart = np.maximum.accumulate(np.where(x == EOT, np.arange(x.size), 0))
    assert (base_len <= np.arange(x.size) - docstart + 1).all()
    # a match that would cross into the previous document is cut at its EOT
    d = np.array([EOT, 1, 2, EOT, 3, EOT, 5, 1, 2, EOT, 3], np.int32)
    ln, _ = run(d, "position", 0, chunks=1)
    assert ln[-1] == 2  # "EOT 3", not "1 2 EOT 3"
    assert ln[8] == 2 and ln[9] == 1


def test_rejects_bad_tokens_and_modes():
    with pytest.raises(ValueError, match="mode"):
        OnlineLEM(EOT, mode="token")
    with pytest.raises(ValueError, match="token id -1"):
        OnlineLEM(EOT).step(np.array([1, -1]))
    with pytest.raises(TypeError, match="integer token ids, not float64"):
        OnlineLEM(EOT).step(np.array([1.7, 2.2]))
    with pytest.raises(TypeError, match="not bool"):
        OnlineLEM(EOT).step(np.array([True]))
    for kw in ({"eot": -1}, {"eot": 2**40}, {"k": 2.5}, {"window": 2.5}, {"window": 2**40}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            OnlineLEM(**{"eot": EOT, **kw})


def test_lemstream_equals_inline_and_blocks(first):
    B, T, steps, ahead = 4, 256, 50, 3
    batches = first[: steps * B * T].reshape(steps, B, T)
    inline = OnlineLEM(EOT, k=2, mode="step", window=0)
    want = [inline.step(b) for b in batches]
    with LEMStream(lambda s: batches[s], shape=(B, T), eot=EOT, k=2, n_steps=steps,
                   ahead=ahead, window=0) as stream:
        time.sleep(1.5)  # the consumer does not read: the producer must stop at `ahead`
        c = stream.counters
        assert c["produced"] == ahead and c["consumed"] == 0 and c["lag"] == ahead
        for s in range(steps):
            ml, nt = stream.get(s)
            assert ml.shape == (B, T) and nt.shape == (B, T, 2) and ml.dtype == np.int32
            np.testing.assert_array_equal(ml, want[s][0])
            np.testing.assert_array_equal(nt, want[s][1])
            assert stream.counters["lag"] <= ahead
        c = stream.counters
        assert c["produced"] == steps and c["consumed"] == steps
        assert c["tokens"] == steps * B * T and c["tokens_per_s"] > 0
        assert c["producer_blocked_s"] > 1.0
        with pytest.raises(ValueError, match="in order"):
            stream.get(0)


def test_lemstream_reports_producer_errors():
    def bad(step):
        if step == 2:
            raise KeyError("loader broke")
        return np.zeros((2, 8), np.int32)

    with LEMStream(bad, shape=(2, 8), eot=EOT, n_steps=5, window=0) as stream:
        stream.get(0)
        stream.get(1)
        with pytest.raises(RuntimeError, match="loader broke"):
            stream.get(2)


def test_lemstream_from_an_iterable(first):
    batches = [first[i * 64:(i + 1) * 64].reshape(2, 32) for i in range(5)]
    inline = OnlineLEM(EOT, k=1, mode="position", window=0)
    with LEMStream(iter(batches), shape=(2, 32), eot=EOT, k=1, mode="position",
                   window=0) as stream:
        got = [(ml.copy(), nt.copy()) for ml, nt in stream]
    assert len(got) == 5
    for b, (ml, nt) in zip(batches, got, strict=True):
        want_ml, want_nt = inline.step(b)
        np.testing.assert_array_equal(ml, want_ml)
        np.testing.assert_array_equal(nt, want_nt)


@pytest.mark.parametrize("mode,step", [("position", 0), ("step", 512)])
def test_wide_rows_repetitive_text_and_empty_batches(first, mode, step):
    """k = 8 needs a two-cache-line state row; a stretch repeated many times drives long
    suffix-link paths, clones of hashed (high-degree) states and table growth; empty
    batches change nothing."""
    rng = np.random.default_rng(3)
    motif = first[1000:1400]
    parts = [first[:20_000]]
    for _ in range(12):  # near-copies: the same stretch with a few tokens changed
        m = motif.copy()
        m[rng.integers(0, m.size, 3)] = rng.integers(0, 500, 3)
        parts.append(m)
    x = np.ascontiguousarray(np.concatenate(parts))
    lem = OnlineLEM(EOT, k=8, mode=mode, window=0)
    chunk = step or 3001
    got = []
    for i in range(0, x.size, chunk):
        e_len, e_next = lem.step(x[i:i][None, :])
        assert e_len.shape == (1, 0) and e_next.shape == (1, 0, 8)
        got.append(lem.step(x[i:i + chunk]))
    want_len, want_next = lem_oracle(x, EOT, 8, step, 0)
    np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), want_len)
    np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), want_next)
    assert want_len.max() >= 100 and (want_next[:, 7] >= 0).sum() > 1000


@pytest.mark.parametrize("mode,step", [("position", 0), ("step", 700)])
@pytest.mark.parametrize("max_len", [1, 3, 16, 200])
def test_max_len_caps_matches_exactly_inside_long_runs(first, mode, step, max_len):
    """With ``max_len`` the answer is the oracle's capped one, also through long runs of
    one token and of a short period (where an uncapped automaton does O(run) work per
    token) and with a window that evicts mid-run."""
    x = np.concatenate([first[:3000], np.full(2500, 13, np.int32), first[3000:4000],
                        np.tile(np.array([7, 8, 9], np.int32), 600), first[:1500]])
    x = np.ascontiguousarray(x)
    for window in (0, 3000):
        lem = OnlineLEM(EOT, k=4, mode=mode, window=window, max_len=max_len)
        chunk = step or 997
        got = [lem.step(x[i:i + chunk]) for i in range(0, x.size, chunk)]
        want_len, want_next = lem_oracle(x, EOT, 4, step, window // 2, max_len)
        np.testing.assert_array_equal(np.concatenate([g[0] for g in got]), want_len)
        np.testing.assert_array_equal(np.concatenate([g[1] for g in got]), want_next)
        assert want_len.max() == max_len
