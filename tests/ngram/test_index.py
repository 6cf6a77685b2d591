"""Suffix-array index against naive numpy scans over the quickstart train shards."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import read_sidecar, read_tokens
from tokenmill.manifests.verify import ShardVerifyError
from tokenmill.ngram.index import IndexError_, SuffixArrayIndex, build_index

EOT = 50256


@pytest.fixture(scope="module")
def index(quickstart, tmp_path_factory) -> SuffixArrayIndex:
    out = tmp_path_factory.mktemp("sa_index")
    summary = build_index(quickstart, out, split="train", progress=False)
    assert 6.0 <= summary["bytes_per_token"] < 6.2
    return SuffixArrayIndex(out)


@pytest.fixture(scope="module")
def by_token(train_stream):
    """token id -> sorted positions in the train stream (for naive scans)."""
    order = np.argsort(train_stream, kind="stable")
    bounds = np.searchsorted(train_stream[order], np.arange(EOT + 2))
    return lambda t: order[bounds[t]:bounds[t + 1]]


def naive_positions(stream, by_token, ngram):
    ngram = np.asarray(ngram)
    if (ngram[1:] == EOT).any():
        return np.zeros(0, np.int64)
    pos = by_token(int(ngram[0]))
    pos = pos[pos + ngram.size <= stream.size]
    for k in range(1, ngram.size):
        pos = pos[stream[pos + k] == ngram[k]]
    return np.sort(pos)


def test_count_matches_naive(index, train_stream, by_token):
    rng = np.random.default_rng(0)
    present, absent = [], []
    while len(present) < 1000:
        n = int(rng.integers(1, 9))
        p = int(rng.integers(0, train_stream.size - n))
        present.append(train_stream[p:p + n].tolist())
    while len(absent) < 1000:
        g = rng.integers(0, EOT, size=int(rng.integers(2, 9))).tolist()
        if naive_positions(train_stream, by_token, g).size == 0:
            absent.append(g)
    got = index.count_batch(present + absent)
    want = [naive_positions(train_stream, by_token, g).size for g in present + absent]
    np.testing.assert_array_equal(got, want)
    assert (got[:1000] > 0).sum() > 900  # most drawn n-grams do not span documents
    assert (got[1000:] == 0).all()
    for g, w in zip(present[:100], want[:100], strict=True):
        assert index.count(g) == w
    # an n-gram spanning a document boundary never counts, even though the tokens follow
    # each other in the shard
    p = int(np.flatnonzero(train_stream == EOT)[5])
    assert index.count(train_stream[p - 2:p + 2].tolist()) == 0
    assert index.count([EOT]) == int((train_stream == EOT).sum())
    assert index.count([]) == train_stream.size


def test_next_token_distribution_matches_naive(index, train_stream, by_token):
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(0, 6))
        p = int(rng.integers(0, train_stream.size - n))
        ctx = train_stream[p:p + n]
        if n and (ctx[1:] == EOT).any():
            continue
        if n == 0:
            nxt = train_stream
        else:
            pos = naive_positions(train_stream, by_token, ctx) + n
            nxt = np.where(pos < train_stream.size, train_stream[np.minimum(
                pos, train_stream.size - 1)], EOT)
        want_t, want_c = np.unique(nxt, return_counts=True)
        got_t, got_c = index.next_token_distribution(ctx.tolist())
        np.testing.assert_array_equal(got_t, want_t)
        np.testing.assert_array_equal(got_c, want_c)
        top_t, top_c = index.next_token_distribution(ctx.tolist(), k=3)
        order = np.lexsort((want_t, -want_c))[:3]
        np.testing.assert_array_equal(top_c[:order.size], want_c[order])
        np.testing.assert_array_equal(top_t[:order.size], want_t[order])


def naive_longest(stream, by_token, ctx):
    ctx = np.asarray(ctx)
    eots = np.flatnonzero(ctx == EOT)
    hi = ctx.size - (int(eots[-1]) if eots.size else 0)
    ends = by_token(int(ctx[-1]))
    if ends.size == 0:
        return 0
    best = 0
    alive = ends
    for L in range(1, hi + 1):
        alive = alive[alive - (L - 1) >= 0]
        alive = alive[stream[alive - (L - 1)] == ctx[ctx.size - L]]
        if alive.size == 0:
            break
        best = L
    return best


def test_longest_match_matches_naive(index, train_stream, by_token):
    rng = np.random.default_rng(2)
    contexts = []
    for _ in range(1000):
        n = int(rng.integers(1, 40))
        p = int(rng.integers(n, train_stream.size))
        ctx = train_stream[p - n:p].copy()
        cut = int(rng.integers(0, n))  # a random prefix makes the match partial
        ctx[:cut] = rng.integers(0, EOT, size=cut)
        contexts.append(ctx.tolist())
    lens, cnts, nt, nc = index.longest_match_batch(contexts, k=4)
    for i, ctx in enumerate(contexts):
        L = naive_longest(train_stream, by_token, ctx)
        assert lens[i] == L, (i, ctx)
        if L:
            assert cnts[i] == naive_positions(train_stream, by_token, ctx[-L:]).size
    assert (lens >= 1).all() and lens.max() > 20
    one = index.longest_match(contexts[0], k=4)
    assert one.length == lens[0]
    np.testing.assert_array_equal(one.next_tokens, nt[0])
    t, c = index.next_token_distribution(contexts[0][len(contexts[0]) - one.length:], k=4)
    np.testing.assert_array_equal(t, nt[0])
    np.testing.assert_array_equal(c, nc[0])


def test_find_names_shard_position_document(index, quickstart, train_stream):
    m = load_manifest(quickstart)
    ngram = train_stream[1000:1004].tolist()
    occ = index.find(ngram, k=5)
    assert 1 <= len(occ) <= 5
    for o in occ:
        shard = quickstart.parent / o.shard
        toks = read_tokens(shard)
        assert toks[o.position:o.position + 4].tolist() == ngram
        side = read_sidecar(shard)
        offs = side.column("offset").to_numpy()
        d = int(np.searchsorted(offs, o.position, side="right") - 1)
        assert side.column("key").to_pylist()[d] == o.document
    keys = [(s.path) for s in m.shards("train")]
    assert [(keys.index(o.shard), o.position) for o in occ] == sorted(
        (keys.index(o.shard), o.position) for o in occ)


def test_bad_queries_and_folders(index, tmp_path):
    with pytest.raises(IndexError_, match="token id 99999"):
        index.count([1, 99999])
    with pytest.raises(IndexError_, match="token id -3"):
        index.count_batch([[1], [-3]])
    with pytest.raises(IndexError_, match="meta.json"):
        SuffixArrayIndex(tmp_path)


def test_multi_part_index_equals_single_part(index, quickstart, train_stream, tmp_path):
    s = build_index(quickstart, tmp_path, split="train", progress=False,
                    max_part_tokens=700_000)
    n_train = len(load_manifest(quickstart).shards("train"))
    assert s["parts"] >= 3 and s["shards"] == n_train
    multi = SuffixArrayIndex(tmp_path)
    rng = np.random.default_rng(5)
    qs = []
    for _ in range(300):
        n = int(rng.integers(1, 12))
        p = int(rng.integers(0, train_stream.size - n))
        qs.append(train_stream[p:p + n].tolist())
    np.testing.assert_array_equal(multi.count_batch(qs), index.count_batch(qs))
    for a, b in zip(multi.longest_match_batch(qs, k=3), index.longest_match_batch(qs, k=3),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    for q in qs[:20]:
        for a, b in zip(multi.next_token_distribution(q), index.next_token_distribution(q),
                        strict=True):
            np.testing.assert_array_equal(a, b)
    assert multi.count([]) == train_stream.size
    assert [(o.shard, o.position) for o in multi.find(qs[0], k=3)] == [
        (o.shard, o.position) for o in index.find(qs[0], k=3)]


def test_parallel_part_builds_write_identical_files(quickstart, tmp_path):
    """Parts sorted concurrently are written in part order: the files do not depend on
    ``workers``."""
    digests = []
    for w in (1, 3):
        out = tmp_path / f"w{w}"
        s = build_index(quickstart, out, split="train", progress=False,
                        max_part_tokens=700_000, workers=w)
        assert s["parts"] >= 3
        digests.append({n: hashlib.sha256((out / n).read_bytes()).hexdigest()
                        for n in ("tokens.bin", "sa.bin", "docs.parquet")})
    assert digests[0] == digests[1]
    with pytest.raises(IndexError_, match="workers"):
        build_index(quickstart, tmp_path / "bad", workers=0)


def _copy_datamix(manifest: Path, dst: Path) -> Path:
    shutil.copytree(manifest.parent, dst)
    return dst / manifest.name


def test_build_refuses_corrupt_or_out_of_vocabulary_shards(quickstart_like, tmp_path):
    from tokenmill.manifests.shards import HEADER_BYTES

    m = load_manifest(quickstart_like)
    shard = m.shards("train")[0].path
    # a flipped token (same size, so only the checksum can tell)
    bad = _copy_datamix(quickstart_like, tmp_path / "flip")
    with open(bad.parent / shard, "r+b") as f:
        f.seek(HEADER_BYTES + 2 * 100)
        f.write(b"\x07\x00")
    with pytest.raises(ShardVerifyError, match=rf"{Path(shard).name}: sha256 .* differs"):
        build_index(bad, tmp_path / "idx_flip", progress=False)
    assert not (tmp_path / "idx_flip").exists()  # refused before any output
    # an id beyond gpt2's vocabulary, with verification explicitly off
    oov = _copy_datamix(quickstart_like, tmp_path / "oov")
    with open(oov.parent / shard, "r+b") as f:
        f.seek(HEADER_BYTES + 2 * 100)
        f.write(np.uint16(60_000).tobytes())
    with pytest.raises(ShardVerifyError, match="sha256"):
        build_index(oov, tmp_path / "idx_oov", progress=False)
    with pytest.raises(IndexError_, match=r"token id 60000 at offset 100 is outside"):
        build_index(oov, tmp_path / "idx_oov", progress=False, verify=False)
    # a half-written output folder (no manifest.json) is refused, naming it
    half = _copy_datamix(quickstart_like, tmp_path / "half")
    half.unlink()
    with pytest.raises(ShardVerifyError, match="manifest"):
        build_index(half.parent, tmp_path / "idx_half", progress=False)


def test_corrupt_index_files_and_bad_queries_are_clear_errors(index, tmp_path):
    # a suffix array of the right size pointing out of range: refused at open (no crash)
    bad = tmp_path / "bad"
    shutil.copytree(index.folder, bad)
    sa = np.memmap(bad / "sa.bin", dtype=np.uint8, mode="r+")
    sa[4096:8192] = 0xFF
    sa.flush()
    del sa
    with pytest.raises(IndexError_, match=r"sa.bin: entry \d+ .* outside its part"):
        SuffixArrayIndex(bad)
    meta = tmp_path / "meta"
    shutil.copytree(index.folder, meta)
    (meta / "meta.json").write_text("{not json")
    with pytest.raises(IndexError_, match="meta.json: not valid JSON"):
        SuffixArrayIndex(meta)
    raw = json.loads((index.folder / "meta.json").read_text())
    del raw["sentinel"]
    (meta / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(IndexError_, match="meta.json: malformed .*sentinel"):
        SuffixArrayIndex(meta)
    for q in (262, [[262, 318]], "the", [1.5], [2**63]):
        with pytest.raises(IndexError_):
            index.count(q)
    with pytest.raises(IndexError_, match="2-D array"):
        index.count_batch(np.array([262, 318]))
    assert index.count_batch(iter([[262], [262, 318]])).tolist() == [
        index.count([262]), index.count([262, 318])]
    for call in (lambda: index.find([262], k=-1), lambda: index.longest_match([262], k=-1),
                 lambda: index.longest_match([262], max_len=-3),
                 lambda: index.next_token_distribution([262], k=-1),
                 lambda: index.next_token_topk_batch([[262]], k=-2)):
        with pytest.raises(IndexError_, match=">= 0"):
            call()


def test_find_empty_ngram_skips_part_sentinels(quickstart, tmp_path):
    """Every position of every shard, and no part's end sentinel, is an occurrence of the
    empty n-gram (the validation shards, one part each: a few hundred thousand tokens)."""
    build_index(quickstart, tmp_path, split="val", progress=False, max_part_tokens=1)
    multi = SuffixArrayIndex(tmp_path)
    assert multi.parts.size - 1 >= 3  # parts
    occ = multi.find([], k=10**9)
    assert len(occ) == multi.count([]) == multi.n_tokens
    sizes = {s["shard"]: s["tokens"] for s in multi.meta["shards"]}
    assert all(o.position < sizes[o.shard] for o in occ)
