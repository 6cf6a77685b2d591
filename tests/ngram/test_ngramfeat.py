"""precompute_ngram (the n-gram side channel) equals a brute-force interpolated model over
the allowed history, position for position; it is causal by chunks; val features use the
train counts only; `tokenmill ngram features` writes the files of its module docstring and
lists them in the mix manifest."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pytest

from tests.shared import corpora
from tokenmill.ngram.ngramfeat import feature_stats, precompute_ngram

ORDERS = list(range(2, 9))


def _counts(segments, orders, eot):
    """Plain-dict counts of each segment (the index's conventions: a context may hold EOT
    only as its first token; the token after a segment's last one is EOT)."""
    uni = defaultdict(int)
    ctx = {n: defaultdict(lambda: defaultdict(int)) for n in orders}
    for seg in segments:
        s = [int(t) for t in seg]
        for t in s:
            uni[t] += 1
        for n in orders:
            L = n - 1
            for i in range(len(s) - L + 1):
                c = tuple(s[i:i + L])
                if eot in c[1:]:
                    continue
                ctx[n][c][s[i + L] if i + L < len(s) else eot] += 1
    return uni, ctx


def _reference_one(x, p, uni, ctx, n_uni, V, orders, beta, eot, m):
    """P_1(t) = (c(t) + 1) / (N + V); P_n(t) = (c_n(t) + beta P_{n-1}(t)) / (C_n + beta)
    over the whole vocabulary (elementwise float64, as counts.py), then the top m by
    probability descending, smaller id first."""
    probs = (np.array([uni.get(t, 0) for t in range(V)], np.int64) + 1.0) / (n_uni + V)
    for n in orders:
        L = n - 1
        if p - L + 1 < 0:
            continue
        c = tuple(int(t) for t in x[p - L + 1:p + 1])
        if eot in c[1:] or c not in ctx[n]:
            continue
        fol = ctx[n][c]
        cnt = np.zeros(V, np.int64)
        for t, k in fol.items():
            cnt[t] = k
        probs = (cnt + beta * probs) / (sum(fol.values()) + beta)
    top = np.lexsort((np.arange(V), -probs))[:m].tolist()
    return top, [math.log(probs[t]) for t in top]


def reference(x, *, chunk, history=None, orders=ORDERS, beta=1.0, eot=0, V, m):
    """Brute force: for each chunk, dict counts of (history, stream before the chunk) and
    the interpolated distribution over the whole vocabulary at every position."""
    n = len(x)
    cand = np.full((n, m), -1, np.int32)
    logp = np.full((n, m), -np.inf, np.float64)
    size = n if chunk is None else chunk
    for a in range(0, n, size):
        segs = [s for s in ([] if history is None else [history]) + [x[:a]] if len(s)]
        if not segs:
            continue
        uni, ctx = _counts(segs, orders, eot)
        n_uni = sum(len(s) for s in segs)
        for p in range(a, min(n, a + size)):
            top, lp = _reference_one(x, p, uni, ctx, n_uni, V, orders, beta, eot, m)
            cand[p, :len(top)] = top
            logp[p, :len(top)] = lp
    return cand, logp


def assert_equal_ref(want, got, what):
    (wc, wl), (gc, gl) = want, got
    assert gc.dtype == np.int32 and gl.dtype == np.float32 and gc.shape == wc.shape, what
    bad = np.flatnonzero((wc != gc).any(axis=1))
    assert bad.size == 0, (f"{what}: first candidate difference at position {bad[0]}: "
                           f"reference {wc[bad[0]]}, got {gc[bad[0]]}")
    fin = np.isfinite(wl)
    assert (np.isfinite(gl) == fin).all(), what
    np.testing.assert_allclose(gl[fin], wl[fin], atol=1e-5, rtol=0, err_msg=what)


def streams(seed):
    """A random stream and a repetitive one (motif with noise), EOT = 0."""
    rng = np.random.default_rng(seed)
    V = 12
    x = rng.integers(0, V, 700)
    x[rng.random(700) < 0.03] = 0
    yield "random", x.astype(np.int32), V
    motif = rng.integers(1, V, 9)
    y = np.tile(motif, 80)[:700]
    noise = rng.random(700) < 0.06
    y[noise] = rng.integers(0, V, int(noise.sum()))
    yield "repetitive", y.astype(np.int32), V


def test_equals_brute_force_large_vocabulary():
    """V = 300 (Zipf-like, with repeated phrases): more tokens than the first candidate
    round holds, so the threshold test and its deepening decide the top-m."""
    rng = np.random.default_rng(11)
    V = 300
    w = 1.0 / np.arange(1, V + 1)
    x = rng.choice(V, 900, p=w / w.sum())
    phrase = rng.integers(1, V, 12)
    for a in rng.integers(0, 880, 25):
        x[a:a + 12] = phrase[:min(12, 900 - a)]
    x = x.astype(np.int32)
    for chunk, m in ((300, 8), (450, 20)):
        want = reference(x, chunk=chunk, V=V, m=m)
        got = precompute_ngram(x, chunk_tokens=chunk, eot=0, n_vocab=V, m=m)
        assert_equal_ref(want, got, f"zipf V=300 chunk {chunk} m {m}")


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_brute_force(seed):
    for name, x, V in streams(seed):
        for chunk, beta, m in ((150, 1.0, 8), (233, 0.5, 3)):
            want = reference(x, chunk=chunk, beta=beta, V=V, m=m)
            got = precompute_ngram(x, chunk_tokens=chunk, beta=beta, eot=0, n_vocab=V, m=m)
            assert_equal_ref(want, got, f"{name} seed {seed} chunk {chunk} beta {beta} m {m}")
    assert (got[0][:chunk] == -1).all()  # first chunk: no history, no candidates


def test_orders_subset_and_history():
    (_, x, V), (_, h, _) = streams(3)
    want = reference(x, chunk=200, history=h, orders=[2, 3, 5], V=V, m=4)
    got = precompute_ngram(x, chunk_tokens=200, history=h, orders=[2, 3, 5], eot=0,
                           n_vocab=V, m=4)
    assert_equal_ref(want, got, "orders 2,3,5 with history")


def test_causal_by_chunks():
    """Changing the stream from q on changes no position p < q; changing one token at q
    changes no position of q's chunk whose context (7 tokens back) does not reach q."""
    _, x, V = next(streams(4))
    chunk = 128
    base = precompute_ngram(x, chunk_tokens=chunk, eot=0, n_vocab=V)
    rng = np.random.default_rng(5)
    for q in (130, 300, 383, 600):
        y = x.copy()
        y[q:] = rng.integers(0, V, x.size - q)
        got = precompute_ngram(y, chunk_tokens=chunk, eot=0, n_vocab=V)
        np.testing.assert_array_equal(got[0][:q], base[0][:q], err_msg=f"q={q}")
        np.testing.assert_array_equal(got[1][:q], base[1][:q], err_msg=f"q={q}")
        z = x.copy()
        z[q] = (x[q] + 1) % V
        got = precompute_ngram(z, chunk_tokens=chunk, eot=0, n_vocab=V)
        end = (q // chunk + 1) * chunk
        np.testing.assert_array_equal(got[0][q + 7:end], base[0][q + 7:end], err_msg=f"q={q}")
        np.testing.assert_array_equal(got[1][q + 7:end], base[1][q + 7:end], err_msg=f"q={q}")


def test_val_uses_train_counts_only():
    """history=train, one chunk: every val position uses the train counts only (equal to
    the brute force over train alone); a val token changes only the positions whose
    context holds it."""
    (_, train, V), (_, val, _) = streams(6)
    val = val[:300]
    got = precompute_ngram(val, history=train, chunk_tokens=None, eot=0, n_vocab=V)
    assert_equal_ref(reference(val, chunk=None, history=train, V=V, m=8), got, "val")
    v2 = val.copy()
    v2[100] = (val[100] + 1) % V
    got2 = precompute_ngram(v2, history=train, chunk_tokens=None, eot=0, n_vocab=V)
    same = np.ones(val.size, bool)
    same[100:107] = False
    np.testing.assert_array_equal(got2[0][same], got[0][same])
    np.testing.assert_array_equal(got2[1][same], got[1][same])


def test_in_memory_index_large_vocabulary():
    """SuffixArrayIndex.from_tokens with uint32 tokens (n_vocab > 65,535) sorts like the
    uint16 path (its sentinel last) and counts the same."""
    from tokenmill.ngram.index import SuffixArrayIndex

    (_, x, _), (_, y, _) = streams(7)
    small = SuffixArrayIndex.from_tokens([x, y], eot=0, n_vocab=12)
    big = SuffixArrayIndex.from_tokens([x, y], eot=0, n_vocab=70_000)
    assert big.tokens.dtype == np.uint32 and small.tokens.dtype == np.uint16
    np.testing.assert_array_equal(big.sa, small.sa)
    for q in ([x[-2], x[-1]], [y[5], y[6], y[7]], [3], []):
        assert big.count(q) == small.count(q)


def test_feature_stats():
    x = np.array([1, 2, 3, 4], np.int32)
    cand = np.array([[2, 5], [6, 3], [-1, -1], [1, 2]], np.int32)
    s = feature_stats(x, cand)
    assert s == {"recall": 1.0, "top1": 0.5, "covered": 2 / 3}


@pytest.mark.parametrize("kwargs, err", [({"m": 0}, ValueError), ({"chunk_tokens": 0}, ValueError),
                                         ({"orders": [1, 2]}, ValueError),
                                         ({"beta": 0.0}, ValueError)])
def test_bad_arguments(kwargs, err):
    with pytest.raises(err):
        precompute_ngram(np.array([1, 2, 3], np.int32), eot=0, n_vocab=5, **kwargs)


def test_bad_tokens():
    with pytest.raises(ValueError, match="token 7 at position 2"):
        precompute_ngram(np.array([1, 2, 7], np.int32), eot=0, n_vocab=5)
    with pytest.raises(ValueError, match="history: token -1 at position 0"):
        precompute_ngram(np.array([1, 2], np.int32), eot=0, n_vocab=5, history=np.array([-1]))
    with pytest.raises(TypeError, match="integer"):
        precompute_ngram(np.array([1.0, 2.0]), eot=0, n_vocab=5)


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def small_mix(tmp_path_factory):
    """A two-source training mix (c4 + wikipedia, gpt2) of about 150,000 tokens."""
    from tests.manifests.mixdata import cached_test_curations, write_spec
    from tokenmill.manifests.mix import build_mix

    cur = cached_test_curations(corpora("c4-en-sample").parent)
    tmp = tmp_path_factory.mktemp("ngram_mix")
    sources = {"c4": {"source": "c4-en-sample", "weight": 0.6, "max_epochs": 3},
               "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.4, "max_epochs": 3}}
    spec = write_spec(tmp / "mix.yaml", [cur["web"], cur["ref"]], sources, 150_000)
    build_mix(spec, tmp / "mix.json")
    return tmp / "mix.json"


def _read_side(out, meta):
    cand = np.concatenate([np.load(out / f["cand"]) for f in meta["files"]])
    logp = np.concatenate([np.load(out / f["logp"]) for f in meta["files"]])
    return cand, logp


def test_cli_features_side_channel(small_mix, tmp_path, capsys):
    """`tokenmill ngram features` (train and val): the files of its module docstring with their
    sha256, listed in the mix manifest, whose identity sha256 does not change; the arrays
    equal precompute_ngram over the MixLoader stream (val: with the train stream as
    history)."""
    from tokenmill.atomic import sha256_file
    from tokenmill.cli import main
    from tokenmill.manifests.mixschema import load_mix_manifest, mix_identity_sha256
    from tokenmill.ngram.sidechannel import mix_stream

    ident = mix_identity_sha256(small_mix)
    opts = ["--seq-len", "128", "--batch-size", "4", "-q"]
    outs = {s: small_mix.parent / f"ngram_{s}" for s in ("train", "val")}
    assert main(["ngram", "features", str(small_mix), "-o", str(outs["train"]), *opts,
                 "-m", "4", "--chunk-tokens", "50000", "--shard-tokens", "60000"]) == 0
    assert main(["ngram", "features", str(small_mix), "-o", str(outs["val"]), *opts,
                 "-m", "4", "--split", "val"]) == 0
    printed = capsys.readouterr().out
    assert "n-gram side channel (train)" in printed and "bytes/token" in printed
    assert mix_identity_sha256(small_mix) == ident
    listed = {r.split: r for r in load_mix_manifest(small_mix).side_channels}
    assert set(listed) == {"train", "val"}
    train = mix_stream(small_mix, seq_len=128, batch_size=4)[0]
    for split, out in outs.items():
        meta = json.loads((out / "ngram.json").read_text())
        ref = listed[split]
        assert ref.kind == "ngram-side-channel" and ref.path == f"ngram_{split}/ngram.json"
        assert ref.sha256 == sha256_file(out / "ngram.json")
        assert meta["mix_sha256"] == ident and meta["split"] == split and meta["m"] == 4
        assert meta["orders"] == ORDERS and meta["kind"] == "ngram-side-channel"
        names = {f.path: f.sha256 for f in ref.files}
        for f in meta["files"]:
            for k in ("cand", "logp"):
                assert sha256_file(out / f[k]) == f[f"{k}_sha256"]
                assert names[f"ngram_{split}/{f[k]}"] == f[f"{k}_sha256"]
        assert len(names) == 2 * len(meta["files"])
        stream = train if split == "train" else mix_stream(small_mix, split="val",
                                                           seq_len=128, batch_size=4)[0]
        assert meta["tokens"] == stream.size
        cand, logp = _read_side(out, meta)
        assert cand.dtype == np.uint16 and logp.dtype == np.float16
        assert cand.shape == (stream.size, 4)
        want = precompute_ngram(stream, m=4, eot=50256, n_vocab=50257,
                                chunk_tokens=50000 if split == "train" else None,
                                history=None if split == "train" else train)
        np.testing.assert_array_equal(cand, np.where(want[0] < 0, 65535, want[0]))
        np.testing.assert_array_equal(logp, want[1].astype(np.float16))
    assert len(json.loads((outs["train"] / "ngram.json").read_text())["files"]) > 1


def test_default_chunks_give_short_streams_features():
    """At most 16 chunks, 1 Mi tokens where that makes 4-16, and at least 4 chunks, so a
    stream under 1 Mi tokens still gets features after its first quarter."""
    from tokenmill.ngram.ngramfeat import default_chunk_tokens

    assert default_chunk_tokens(149_640) == 37_410  # 4 chunks
    assert default_chunk_tokens(8_150_800) == 1 << 20  # 8 chunks (the quickstart mix)
    assert default_chunk_tokens(100_000_000) == 6_250_000  # 16 chunks
    assert default_chunk_tokens(0) == 1


@pytest.mark.parametrize(("opts", "err"), [
    (["--seq-len", "1000000"], "has no whole step of 1 x 1000001 tokens"),
    (["--batch-size", "-1"], "expected an integer >= 1, not '-1'"),
    (["--split", "val", "--chunk-tokens", "1000"], "--chunk-tokens applies to --split train"),
    (["-o", "FILE"], "-o must be a folder, this is a file"),
])
@pytest.mark.parametrize("command", ["features", "lem"])
def test_cli_bad_geometry_is_one_line_before_any_work(small_mix, tmp_path, capsys, command,
                                                      opts, err):
    """Impossible stream geometry or output folder: exit 2 with one line, nothing written
    and nothing listed in the mix manifest."""
    from tokenmill.cli import main

    if command == "lem" and "--chunk-tokens" in opts:
        return  # a features-only option
    (tmp_path / "FILE").write_text("x")
    opts = [str(tmp_path / "FILE") if o == "FILE" else o for o in opts]
    out = ["-o", str(tmp_path / "side")] if "-o" not in opts else []
    before = small_mix.read_bytes()
    with pytest.raises(SystemExit) if "integer" in err else _no_raise():
        code = main(["ngram", command, str(small_mix), *out, *opts])
        assert code == 2
    text = capsys.readouterr().err
    assert err in text and "Traceback" not in text
    assert not (tmp_path / "side").exists() and small_mix.read_bytes() == before


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
