"""precompute_lem equals the online oracle (OnlineLEM) position for position: on real gpt2
corpora, random streams and highly repetitive streams, with and without a window, a
max_len cap, chunking and Ray workers; step mode too."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.shared import corpora
from tokenmill.ngram import lem_chunks
from tokenmill.ngram import lem_ray as P
from tokenmill.ngram.lem import OnlineLEM
from tokenmill.ngram.lem_chunks import lem_chunk_position, plan_chunks
from tokenmill.ngram.precompute import precompute_lem
from tokenmill.suffixarray import byte_code, sa_rank_lcp, suffix_array

EOT = 50256


def online(x: np.ndarray, *, eot: int, k: int, mode: str = "position", window: int,
           max_len: int = 0, step_tokens: int | None = None, feed: int = 997):
    """OnlineLEM over x (position mode fed in pieces of ``feed`` tokens, which must not
    matter; step mode in steps of ``step_tokens``)."""
    lem = OnlineLEM(eot, k=k, mode=mode, window=window, max_len=max_len)
    size = feed if mode == "position" else step_tokens
    outs = [lem.step(x[a:a + size]) for a in range(0, x.size, size)] or [
        (np.zeros(0, np.int32), np.zeros((0, k), np.int32))]
    return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])


def assert_same(want, got, what: str) -> None:
    (a, b), (c, d) = want, got
    assert c.dtype == np.int32 and d.dtype == np.int32 and d.shape == b.shape, what
    bad = np.nonzero((a != c) | (b != d).any(axis=1))[0]
    assert bad.size == 0, (f"{what}: first difference at position {bad[0]}: online "
                           f"{a[bad[0]]} {b[bad[0]]}, precomputed {c[bad[0]]} {d[bad[0]]}")


def small_streams(seed: int, count: int):
    """Random streams over tiny vocabularies, motifs repeated with noise, and long runs of
    one token, with EOT (0) boundaries."""
    rng = np.random.default_rng(seed)
    for t in range(count):
        n = int(rng.integers(1, 500))
        v = int(rng.integers(2, 8))
        kind = t % 3
        if kind == 0:
            x = rng.integers(0, v, n)
        elif kind == 1:
            motif = rng.integers(0, v, int(rng.integers(1, 6)))
            x = np.tile(motif, n // motif.size + 1)[:n]
            noise = rng.random(n) < 0.05
            x[noise] = rng.integers(0, v, int(noise.sum()))
        else:
            x = np.full(n, 3)
            x[rng.random(n) < 0.02] = 0
        yield t, x.astype(np.int32), rng


@pytest.mark.parametrize("seed", [0, 1])
def test_position_mode_equals_online_small(seed):
    for t, x, rng in small_streams(seed, 50):
        k = int(rng.integers(1, 5))
        max_len = int(rng.choice([0, 0, 3, 7]))
        window = int(rng.choice([0, 2, 3, 8, 20, 64, 101]))
        if window < 8:  # one chunk per 1-2 tokens: keep those streams short
            x = x[:40]
        want = online(x, eot=0, k=k, window=window, max_len=max_len, feed=int(rng.integers(1, 50)))
        for chunk in (None, 37):
            got = precompute_lem(x, k=k, mode="position", window=window, eot=0,
                                 max_len=max_len, chunk_tokens=chunk)
            assert_same(want, got, f"stream {t} (n={x.size}, k={k}, window={window}, "
                                   f"max_len={max_len}, chunk={chunk})")


def test_step_mode_equals_online_small():
    for t, x, rng in small_streams(2, 45):
        k = int(rng.integers(1, 5))
        max_len = int(rng.choice([0, 3]))
        window = int(rng.choice([0, 8, 20, 64]))
        T = int(rng.integers(1, 40))
        want = online(x, eot=0, k=k, mode="step", window=window, max_len=max_len,
                      step_tokens=T)
        for chunk in (None, 30):
            got = precompute_lem(x, k=k, mode="step", window=window, eot=0, max_len=max_len,
                                 step_tokens=T, chunk_tokens=chunk)
            assert_same(want, got, f"stream {t} (n={x.size}, k={k}, window={window}, "
                                   f"T={T}, chunk={chunk})")


def test_long_repetitive_runs():
    """A 3,000-token run of one token and a long repeated passage: match lengths in the
    thousands, nested intervals thousands deep."""
    rng = np.random.default_rng(5)
    passage = rng.integers(1, 50, 400)
    x = np.concatenate([[0], np.full(3000, 7), [0], passage, passage, [0], passage[:300],
                        rng.integers(0, 50, 500), passage]).astype(np.int32)
    for window, max_len in [(0, 0), (1024, 0), (0, 64), (2000, 100)]:
        want = online(x, eot=0, k=4, window=window, max_len=max_len)
        got = precompute_lem(x, k=4, window=window, eot=0, max_len=max_len,
                             chunk_tokens=1500)
        assert_same(want, got, f"window={window}, max_len={max_len}")


@pytest.fixture(scope="module")
def real_stream(quickstart_like) -> np.ndarray:
    """The first 600,000 train tokens of the quickstart-like gpt2 datamix (real corpora)."""
    from tokenmill.manifests.schema import load_manifest
    from tokenmill.manifests.shards import read_tokens

    m = load_manifest(quickstart_like)
    x = np.concatenate([np.asarray(read_tokens(quickstart_like.parent / s.path), np.int32)
                        for s in m.shards("train")])
    assert x.size > 600_000 and x[0] == EOT
    return x[:600_000]


@pytest.mark.parametrize("window,max_len,k", [(1 << 18, 0, 4), (1 << 17, 64, 3),
                                              (0, 0, 2)])
def test_real_corpora_equal_online(real_stream, window, max_len, k):
    x = real_stream if window else real_stream[:200_000]
    want = online(x, eot=EOT, k=k, window=window, max_len=max_len, feed=65_536)
    got = precompute_lem(x, k=k, window=window, eot=EOT, max_len=max_len,
                         chunk_tokens=50_000 if window else None)
    assert_same(want, got, f"real gpt2 stream, window={window}, max_len={max_len}")
    assert (got[0] > 0).mean() > 0.5  # real text: most positions have a match


@pytest.mark.parametrize("path", ["shared file", "object store"])
def test_real_corpora_ray_workers(real_stream, monkeypatch, tmp_path, path):
    """Chunks as Ray tasks on 2 workers: the same arrays as in-process, whether the tasks
    write into the driver's shared output file (one node) or return their arrays through
    the object store (uint16 for gpt2 ids; int32 for ids of 65,535 or more); step mode
    too. The shared file is removed once the arrays are returned."""
    from tokenmill.raysession import ray_session

    made: list = []
    if path == "object store":
        monkeypatch.setattr(P, "_shared_outputs", lambda n, k: None)
    else:
        monkeypatch.setattr(P, "_SHM", str(tmp_path))  # where the driver puts the file
        shared_outputs = P._shared_outputs
        monkeypatch.setattr(P, "_shared_outputs",
                            lambda n, k: made.append(shared_outputs(n, k)) or made[-1])
    x = real_stream[:200_000]
    wide = np.where(x % 7 == 0, x + 70_000, x).astype(np.int32)  # ids past uint16
    with ray_session(None, 2):
        for stream, what in ((x, "gpt2 ids"), (wide, "ids >= 65,535")):
            want = precompute_lem(stream, k=4, window=1 << 16, eot=EOT)
            got = precompute_lem(stream, k=4, window=1 << 16, eot=EOT, workers=2)
            assert_same(want, got, f"2 Ray workers, {what}, {path}")
        step = {"k": 2, "mode": "step", "window": 1 << 14, "eot": EOT, "step_tokens": 1000}
        want = precompute_lem(x[:30_000], **step)
        assert_same(want, precompute_lem(x[:30_000], **step, workers=2), f"step, {path}")
    assert not list(tmp_path.iterdir())
    assert (len(made) == 3 and all(m is not None for m in made)) == (path == "shared file")


def test_shared_output_files_of_dead_drivers_are_removed(monkeypatch, tmp_path):
    """A SIGKILLed driver cannot unlink its /dev/shm output file: the next call removes
    files whose driver pid is gone, and keeps those of live drivers."""
    monkeypatch.setattr(P, "_SHM", str(tmp_path))
    dead = tmp_path / f"{P._SHM_PREFIX}99999999-abc"
    live = tmp_path / f"{P._SHM_PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated-99999999"
    for f in (dead, live, other):
        f.write_bytes(b"x")
    path, flat = P._shared_outputs(10, 2)
    assert flat.shape == (30,) and not flat.any()
    assert not dead.exists() and live.exists() and other.exists()
    assert Path(path).name.startswith(f"{P._SHM_PREFIX}{os.getpid()}-")
    assert P._shared_outputs(0, 2) is None


def assert_suffix_array(x: np.ndarray, sa: np.ndarray) -> None:
    """``sa`` sorts the suffixes of ``x`` (a permutation; each suffix below the next,
    a proper prefix being the smaller; 4,000 neighbour pairs at most, sampled)."""
    assert sa.dtype == np.int32 and np.array_equal(np.sort(sa), np.arange(x.size))
    pairs = np.random.default_rng(0).permutation(x.size - 1)[:4000]
    for a, b in zip(sa[pairs].tolist(), sa[pairs + 1].tolist(), strict=True):
        n = min(x.size - a, x.size - b)
        diff = np.flatnonzero(x[a:a + n] != x[b:b + n])
        assert (x[a + diff[0]] < x[b + diff[0]]) if diff.size else n == x.size - a, (a, b)


@pytest.mark.parametrize("vocab,expect", [(5, "one byte"), (3000, "two bytes"),
                                          (70_000, "pydivsufsort"), (2**30, "pydivsufsort")])
def test_suffix_array_paths_sort_the_suffixes(vocab, expect):
    """The byte-coded suffix array (one byte per token; one or two bytes) sorts the
    suffixes of the relabelled text (code values: most frequent ids first); ids the code
    cannot take (>= 2**22, > 65,281 distinct) are sorted by pydivsufsort as integers."""
    rng = np.random.default_rng(vocab)
    if vocab == 70_000:  # more distinct ids than the two-byte code holds
        x = rng.permutation(vocab).astype(np.int32)
        x[1000:1600] = x[:600]
    else:
        x = rng.integers(0, vocab, 3000).astype(np.int32)
        x[1500:2100] = x[200:800]  # long repeats
    coded = byte_code(x)
    assert (coded is None) == (expect == "pydivsufsort")
    if coded is not None:
        assert (coded[1] == 256) == (expect == "one byte")
    assert_suffix_array(x if coded is None else coded[0][x], suffix_array(x))
    # the fused path (token-start filter in the rank pass, uint16 text in the LCP pass)
    sa, rank, lcp = sa_rank_lcp(x)
    assert np.array_equal(sa, suffix_array(x))
    assert np.array_equal(rank[sa], np.arange(x.size))
    assert lcp[0] == 0
    for r in np.random.default_rng(1).integers(1, x.size, 2000).tolist():
        a, b = sa[r - 1], sa[r]
        n = min(x.size - a, x.size - b)
        diff = np.flatnonzero(x[a:a + n] != x[b:b + n])
        assert lcp[r] == (diff[0] if diff.size else n), r


def test_large_ids_and_many_distinct_ids_equal_online():
    """Streams the byte code cannot take (ids >= 2**22; > 65,281 distinct ids) give the
    OnlineLEM arrays through pydivsufsort's integer path."""
    rng = np.random.default_rng(11)
    base = rng.integers(1, 40, 3000)
    base[1000:1500] = base[100:600]
    for x in (np.where(base % 7 == 0, base + 2**30, base),
              np.concatenate([rng.permutation(70_000) + 1, base])):
        x = np.concatenate([[0], x]).astype(np.int32)
        want = online(x, eot=0, k=3, window=0)
        assert_same(want, precompute_lem(x, k=3, window=0, eot=0), f"max id {x.max()}")


@pytest.mark.parametrize("scan_max", [0, 1 << 30])
def test_scan_and_sweep_answer_alike(real_stream, monkeypatch, scan_max):
    """Queries answered by the interval scan (all of them, with a huge SCAN_MAX) or by the
    sweep (all of them, SCAN_MAX = 0) give the default split's arrays."""
    x = real_stream[:60_000]
    want = lem_chunk_position(x, 30_000, k=4, eot=EOT)
    monkeypatch.setattr(lem_chunks, "SCAN_MAX", scan_max)
    assert_same(want, lem_chunk_position(x, 30_000, k=4, eot=EOT), f"SCAN_MAX={scan_max}")


def test_chunk_plan_shares_one_history_start():
    for c in plan_chunks(1_000, window=200, chunk_tokens=30):
        start, lo, hi = c
        assert all(max(0, (i // 100 - 1) * 100) == start for i in range(lo, hi)), c
    ch = plan_chunks(1_000, window=200, mode="step", step_tokens=64)
    assert all(lo % 64 == 0 for _, lo, _ in ch) and ch[-1][2] == 1_000


def test_lem_chunk_position_empty_and_single():
    ml, nt = lem_chunk_position(np.zeros(0, np.int32), 0, k=2, eot=0)
    assert ml.shape == (0,) and nt.shape == (0, 2)
    ml, nt = precompute_lem(np.array([5], np.int32), k=2, eot=0)
    assert ml.tolist() == [0] and nt.tolist() == [[-1, -1]]


def test_lem_chunk_position_into_uint16_arrays():
    """``out`` with uint16 next tokens (the Ray tasks' path): the int32 answers with -1 as
    65,535; an id that uint16 cannot hold is refused, never wrapped."""
    x = np.array([0, 7, 8, 9, 0, 7, 8, 9, 0, 7], np.int32)
    want_len, want_next = lem_chunk_position(x, 6, k=2, eot=0)
    out = np.zeros(6, np.int32), np.full((6, 2), 0xFFFF, np.uint16)
    got_len, got_next = lem_chunk_position(x, 6, k=2, eot=0, out=out)
    assert got_next is out[1] and np.array_equal(got_len, want_len)
    wide = got_next.astype(np.int32)
    assert np.array_equal(np.where(wide == 0xFFFF, -1, wide), want_next)
    out = np.zeros(6, np.int32), np.full((6, 2), 0xFFFF, np.uint16)
    with pytest.raises(ValueError, match="cannot hold id 70000"):
        lem_chunk_position(np.where(x == 9, 70_000, x), 6, k=2, eot=0, out=out)


@pytest.mark.parametrize("kwargs,err", [
    ({"mode": "nope"}, "mode must be"), ({"k": 0}, "k must be"), ({"window": 1}, "window"),
    ({"mode": "step"}, "step_tokens"), ({"max_len": -1}, "max_len"),
])
def test_bad_arguments(kwargs, err):
    with pytest.raises(ValueError, match=err):
        precompute_lem(np.arange(10), **kwargs)


def test_bad_tokens():
    with pytest.raises(ValueError, match="position 2"):
        precompute_lem(np.array([1, 2, -3]))
    with pytest.raises(TypeError, match="integer"):
        precompute_lem(np.array([1.0, 2.0]))


@pytest.fixture(scope="module")
def small_mix(tmp_path_factory):
    """A two-source training mix (c4 + wikipedia, gpt2) of about 300,000 tokens."""
    from tests.manifests.mixdata import cached_test_curations, write_spec
    from tokenmill.manifests.mix import build_mix

    cur = cached_test_curations(corpora("c4-en-sample").parent)
    tmp = tmp_path_factory.mktemp("lem_mix")
    sources = {"c4": {"source": "c4-en-sample", "weight": 0.6, "max_epochs": 3},
               "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.4, "max_epochs": 3}}
    spec = write_spec(tmp / "mix.yaml", [cur["web"], cur["ref"]], sources, 300_000)
    build_mix(spec, tmp / "mix.json")
    return tmp / "mix.json"


def test_cli_lem_side_channel(small_mix, tmp_path, capsys):
    """`tokenmill ngram lem MIX -o DIR`: the MixLoader stream's LEM, in shards listed with
    sha256, equal to OnlineLEM over the loader's stream."""
    import json

    from tokenmill.atomic import sha256_file
    from tokenmill.cli import main
    from tokenmill.train.data import MixLoader

    out = tmp_path / "lem"
    assert main(["ngram", "lem", str(small_mix), "-o", str(out), "--seq-len", "128",
                 "--batch-size", "4", "--window", "65536", "-k", "3",
                 "--shard-tokens", "100000"]) == 0
    assert "LEM side channel" in capsys.readouterr().out
    meta = json.loads((out / "lem.json").read_text())
    loader = MixLoader(small_mix, seq_len=128, batch_size=4)
    stream = np.concatenate([np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
                             .reshape(-1) for b in loader]).astype(np.int32)
    assert meta["tokens"] == stream.size and len(meta["files"]) == -(-stream.size // 100_000)
    for f in meta["files"]:
        assert sha256_file(out / f["len"]) == f["len_sha256"]
        assert sha256_file(out / f["next"]) == f["next_sha256"]
    ml = np.concatenate([np.load(out / f["len"]) for f in meta["files"]])
    nt = np.concatenate([np.load(out / f["next"]) for f in meta["files"]])
    assert ml.dtype == np.uint8 and nt.dtype == np.uint16 and nt.shape == (stream.size, 3)
    a, b = online(stream, eot=EOT, k=3, window=65536)
    np.testing.assert_array_equal(ml, np.minimum(a, 255))
    np.testing.assert_array_equal(nt.astype(np.int32), np.where(b < 0, 65535, b))


def test_cli_lem_lists_the_side_channel_in_the_mix(small_mix, tmp_path):
    """`ngram lem` lists its output in the mix manifest (kind, split, lem.json and every
    .npy by paths relative to the manifest's folder, with sha256), binds lem.json to the
    mix identity (the manifest without the listing), and a re-run replaces the entry; the
    trainer's check accepts it after registration and refuses it for a modified mix."""
    import json
    import os
    from pathlib import Path

    from tokenmill.atomic import sha256_file
    from tokenmill.cli import main
    from tokenmill.manifests.mixschema import load_mix_manifest, mix_identity_sha256
    from tokenmill.train.batches import open_data
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.lemside import LEMSideChannelError, check_side_channel

    identity = mix_identity_sha256(small_mix)
    args = ["--seq-len", "128", "--batch-size", "4", "--window", "65536", "-k", "3",
            "--shard-tokens", "150000"]
    listings = []
    for out in (tmp_path / "lem", tmp_path / "lem2"):
        assert main(["ngram", "lem", str(small_mix), "-o", str(out), *args]) == 0
        meta = json.loads((out / "lem.json").read_text())
        assert meta["mix_sha256"] == identity == mix_identity_sha256(small_mix)
        refs = [r for r in load_mix_manifest(small_mix).side_channels
                if r.kind == "lem-side-channel"]
        assert len(refs) == 1 and refs[0].split == "train"  # a re-run replaces the entry
        ref, base = refs[0], small_mix.parent
        assert (base / ref.path).resolve() == (out / "lem.json").resolve()
        assert ref.sha256 == sha256_file(out / "lem.json")
        names = sorted(Path(f.path).name for f in ref.files)
        assert names == sorted(f[key] for f in meta["files"] for key in ("len", "next"))
        assert len(names) == 2 * len(meta["files"]) >= 4
        for f in ref.files:
            assert not os.path.isabs(f.path) and sha256_file(base / f.path) == f.sha256
        listings.append(ref.path)
    assert listings[0] != listings[1]

    cfg = TrainConfig(data=str(small_mix), seq_len=128, batch_size=4, lem=True, lem_k=3,
                      lem_features=str(tmp_path / "lem2"))
    check_side_channel(tmp_path / "lem2" / "lem.json", meta, open_data(cfg), cfg)  # accepted
    changed = small_mix.parent / "changed_mix.json"
    m = load_mix_manifest(small_mix)
    m.model_copy(update={"seed": m.seed + 1}).write(changed)
    with pytest.raises(LEMSideChannelError, match="made for the mix"):
        other = cfg.model_copy(update={"data": str(changed)})
        check_side_channel(tmp_path / "lem2" / "lem.json", meta, open_data(other), other)
