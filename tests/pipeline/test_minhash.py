"""MinHash-LSH fuzzy dedup (tokenmill.pipeline.dedup.minhash) on real corpora."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import random
from collections import defaultdict

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH
from datasketch.lsh import _optimal_param

from tests.pipeline.dedup_oracle import fuzzy_dedup
from tests.shared import corpora
from tokenmill.pipeline.dedup.minhash import (
    SHINGLE_BASE,
    fmix32,
    lsh_params,
    minhash_signatures,
    murmur64a,
    normalize_for_shingles,
    shingle_hash32,
    shingles,
    to_lean_minhash,
    to_minhash,
    word_hash32,
)
from tokenmill.raysession import init_ray


def _cc_docs() -> list[tuple[str, str]]:
    out = []
    for f in sorted(corpora("cc-main-2019-sample", "data").glob("*.jsonl.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                out.append((f"cc/{f.name}#{i:06d}", json.loads(line)["text"]))
    return out


def _true_jaccard(a: str, b: str, ngram: int = 5) -> float:
    sa, sb = set(shingles(a, ngram)), set(shingles(b, ngram))
    return len(sa & sb) / max(1, len(sa | sb))


@pytest.fixture(scope="module")
def ray_2cpu():
    init_ray(num_cpus=2)  # no-op when Ray is already up
    # left running for later tests (Ray shuts down at interpreter exit)


# --------------------------------------------------------------------------- hashing
def _smhasher_verification(hash64) -> int:
    """smhasher's VerificationTest: hash the keys {}, {0}, {0, 1}, ... {0..254} with seed
    256 - len, hash the concatenated 64-bit results with seed 0; the low 32 bits."""
    key = bytes(range(256))
    out = b"".join(hash64(key[:i], 256 - i).to_bytes(8, "little") for i in range(256))
    return hash64(out, 0) & 0xFFFFFFFF


def test_hash_known_vectors():
    # fmix32 is MurmurHash3's finalizer (smhasher): fmix32(0) = 0, fmix32(1) = 0x514E28B7
    assert fmix32(0) == 0 and fmix32(1) == 0x514E28B7
    # words: MurmurHash64A, checked with smhasher's verification value for it ("Murmur2B")
    assert _smhasher_verification(murmur64a) == 0x1F0D3804
    assert word_hash32(b"hello") == murmur64a(b"hello") & 0xFFFFFFFF
    assert word_hash32(b"") == 0  # no blocks, length 0: every step keeps 0
    # shingles: polynomial in SHINGLE_BASE over the word hashes, then fmix32
    h1, h2 = word_hash32(b"hello"), word_hash32(b"world")
    assert shingle_hash32(b"hello world") == fmix32((h1 * SHINGLE_BASE + h2) % 2**32)


def test_kernel_word_lengths_and_block_edges():
    """The kernel's word hash paths (under 8 bytes, 8-16, longer) and its 64-byte ASCII
    blocks: words of every length from 1 to 70 bytes, ASCII and not, at every offset
    against block edges, with non-ASCII bytes and NFKC expansions near the edges; also
    through the kernel directly with no padding after the last document."""
    from tokenmill.pipeline.dedup.minhash import kernels, signatures

    rng = random.Random(5)
    alphabet = "abcXYZ019" + "éßДж中文ﬁ①Ａ" + "\u2019"
    texts = []
    for n in range(1, 71):
        texts.append(" ".join("q" * n for _ in range(7)))
        texts.append(" ".join("É" * n for _ in range(3)) + " " + "x" * n)
    for pad in range(70):
        texts.append("." * pad + " ".join("w" + "k" * (pad % 19) for _ in range(9)) + "é z")
        texts.append("y" * pad + "\u00a0" + "Ω" * (pad % 5) + " tail" * 6)
    for _ in range(300):
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
                 for _ in range(rng.randint(1, 40))]
        texts.append(rng.choice([" ", "  ", ", ", "\n", "—"]).join(words))
    sig = minhash_signatures(texts, num_perm=32, seed=3, ngram=2)
    for t, row in zip(texts, sig, strict=True):
        m = MinHash(num_perm=32, seed=3, hashfunc=shingle_hash32)
        m.update_batch(shingles(t, 2))
        assert np.array_equal(m.hashvalues, row), repr(t[:80])
    # the kernel on unpadded bytes (the last document's tail read byte by byte)
    a, b = signatures.permutations(32, 3)
    for t, row in zip(texts[::17], sig[::17], strict=True):
        raw = np.frombuffer(t.encode("utf-8", "surrogatepass"), np.uint8)
        out = np.empty((1, 32), np.uint32)
        nsh = np.empty(1, np.int64)
        kernels.signatures_kernel(raw, np.array([0, raw.size], np.int64), 2, a, b,
                                  kernels.char_tables(), out, nsh)
        assert np.array_equal(out[0], row), repr(t[:80])


def test_signatures_equal_datasketch_on_real_and_naughty_text():
    """The numba kernel equals datasketch.MinHash(hashfunc=shingle_hash32) updated shingle by
    shingle, on web text and on strings built to break text code (combining marks,
    RTL, emoji, zero-width, lone surrogates)."""
    naughty = json.loads(corpora("naughty-strings", "data", "blns.json").read_text("utf-8"))
    texts = [t for _, t in _cc_docs()[:25]] + naughty + [
        "", "   ", "___", "one", "a b c d", "x\ud800y z", "Straße ＦＵＬＬ ﬁ İstanbul",
        "\ufdfa" * 300, "⑴⑵ ﬃ ㎒ ½ Ⅻ ｶﾞ", "ΑΒΓ Ωmega ǅ Σίσυφος",
        " ".join(naughty[:200]),
    ]
    for num_perm, seed, ngram in [(128, 1, 5), (64, 7, 3), (16, 42, 1)]:
        sig = minhash_signatures(texts, num_perm=num_perm, seed=seed, ngram=ngram)
        assert sig.shape == (len(texts), num_perm) and sig.dtype == np.uint32
        for t, row in zip(texts, sig, strict=True):
            m = MinHash(num_perm=num_perm, seed=seed, hashfunc=shingle_hash32)
            for sh in shingles(t, ngram):
                m.update(sh)
            assert np.array_equal(m.hashvalues, row), repr(t[:80])


def test_normalization_and_shingles():
    assert normalize_for_shingles("Hello,  WORLD!! foo_bar\n\tÉté") == "hello world foo bar été"
    # per-character NFKC: width forms, ligatures, circled digits, NBSP
    assert normalize_for_shingles("ＦＵＬＬ\u00a0ﬁne ① x²") == "full fine 1 x2"
    # ... which does not compose a decomposed accent (the mark is a separator)
    assert normalize_for_shingles("cafe\u0301 ok") == "cafe ok"
    assert shingles("a b c", 5) == [b"a b c"]
    assert shingles("a b c d e f", 5) == [b"a b c d e", b"b c d e f"]
    assert shingles("!!!", 5) == []
    # NFKC expansion beyond the kernel's first buffer (U+FDFA: 1 character, 4 words)
    for text in ("\ufdfa" * 2000, "x \u2474" * 500):
        m = MinHash(num_perm=128, seed=1, hashfunc=shingle_hash32)
        m.update_batch(shingles(text))
        assert np.array_equal(minhash_signatures([text])[0], m.hashvalues)


def test_lean_minhash_interop_and_lsh_params():
    docs = _cc_docs()[:40]
    sig = minhash_signatures([t for _, t in docs])
    lean = [to_lean_minhash(s) for s in sig]
    # datasketch's own estimator on our objects == share of equal values
    assert lean[0].jaccard(lean[1]) == pytest.approx(float(np.mean(sig[0] == sig[1])))
    m = to_minhash(sig[2])
    for sh in shingles(docs[3][1]):
        m.update(sh)  # continues consistently: union of the two documents
    assert np.array_equal(m.hashvalues, np.minimum(sig[2], sig[3]))
    b, r = lsh_params(0.8, 128)
    assert (b, r) == _optimal_param(0.8, 128, 0.2, 0.8) == (12, 10)
    assert lsh_params(0.8, 128, 0.5, 0.5) == _optimal_param(0.8, 128, 0.5, 0.5)
    assert b * r <= 128
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    for (k, _), mh in zip(docs, lean, strict=True):
        lsh.insert(k, mh)
    assert docs[0][0] in lsh.query(lean[0])


# --------------------------------------------------------------------------- dedup rules
def _chain(n_docs: int, length: int = 1000, replace: int = 75, seed: int = 0) -> list[str]:
    """doc i+1 = doc i with a fresh run of ``replace`` words: neighbours' shingle Jaccard
    ~0.85, falling with distance (doc 0 vs doc 7 ~0.29)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(200_000)]
    words = [rng.choice(vocab) for _ in range(length)]
    docs = [" ".join(words)]
    for i in range(1, n_docs):
        start = (i - 1) * (length // n_docs) + 10
        words = words[:start] + [rng.choice(vocab) for _ in range(replace)] + \
            words[start + replace:]
        docs.append(" ".join(words))
    return docs


def test_chain_does_not_collapse(ray_2cpu):
    """A~B~C~D~...~H: each neighbour pair has true Jaccard ~0.85 (>= threshold 0.8), A vs D
    ~0.61 and A vs H < 0.5. LSH joins them all into one candidate cluster; the dedup must
    keep documents that are not near-duplicates of a kept one.

    (Jaccard distance is a metric, so with neighbours at 0.85 A and D cannot be under 0.5
    Jaccard; the 8-document chain provides the pairs under 0.5.)"""
    docs = _chain(8)
    names = "ABCDEFGH"
    tj = [[_true_jaccard(a, b) for b in docs] for a in docs]
    for i in range(7):
        assert 0.82 <= tj[i][i + 1] <= 0.9, tj[i][i + 1]
    assert tj[0][3] < 0.7 and tj[0][7] < 0.5
    keys = [f"chain/{c}" for c in names]
    sig = minhash_signatures(docs)
    est = dict(zip(keys, sig, strict=True))
    # worst case for transitivity: bands so wide that every pair is an LSH candidate
    for exact, kw in itertools.product((True, False), ({"bands": 32, "rows": 4}, {})):
        res = fuzzy_dedup(keys, docs, threshold=0.8, exact_check=exact, **kw)
        print(kw, "removed:", res.removed, "counters:", res.counters)
        if kw:
            assert res.counters["candidate_clusters"] == 1, "the chain is one LSH cluster"
        kept = [c for c in names if f"chain/{c}" not in res.removed]
        assert "A" in kept and len(kept) >= 3, kept
        for k, (twin, j) in res.removed.items():
            assert twin not in res.removed
            true_j = tj[names.index(k[-1])][names.index(twin[-1])]
            assert true_j >= (0.8 if exact else 0.75), (k, twin)
            # exact_check: the exact Jaccard; off: the estimate
            assert j == pytest.approx(true_j if exact else
                                      float(np.mean(est[k] == est[twin])))
            assert j >= 0.8
        if kw:  # all pairs compared: kept documents are pairwise below the threshold
            for a in kept:
                for b in kept:
                    if a < b:
                        assert (tj[names.index(a)][names.index(b)] if exact else
                                np.mean(est[f"chain/{a}"] == est[f"chain/{b}"])) < 0.8


def test_exact_duplicates_and_twins_on_cc_main(ray_2cpu):
    """cc-main-2019-sample: every group of identical texts keeps exactly one document (the
    lowest key); the recorded Jaccard of every removed document with its kept twin is the
    true shingle Jaccard (reference shingling) and at the threshold. With
    ``exact_check=False`` it is the estimate (recomputed independently with datasketch)."""
    docs = _cc_docs()
    keys = [k for k, _ in docs]
    texts = [t for _, t in docs]
    res = fuzzy_dedup(keys, texts, threshold=0.8)
    print("cc-main:", res.counters, "params:", res.params, "clusters:", res.cluster_sizes[:10])
    by_key = dict(docs)
    groups = defaultdict(list)
    for k, t in docs:
        if normalize_for_shingles(t):
            groups[t].append(k)
    multi = [g for g in groups.values() if len(g) > 1]
    assert multi, "the sample is known to hold exact duplicates"
    for g in multi:
        survivors = [k for k in g if k not in res.removed]
        assert survivors == [min(g)], (g, survivors)
    assert res.removed
    worst_true = 1.0
    for k, (twin, j) in res.removed.items():
        assert twin not in res.removed and twin < k
        # the recorded Jaccard is the exact one (reference shingles), at the threshold
        true_j = _true_jaccard(by_key[k], by_key[twin])
        assert j == pytest.approx(true_j) and j >= 0.8, (k, twin, j)
        worst_true = min(worst_true, true_j)
    print(f"removed {len(res.removed)}; lowest true Jaccard with kept twin {worst_true:.3f}")
    # estimate-only (exact_check=False): the former decision, the estimate recorded
    est = fuzzy_dedup(keys, texts, threshold=0.8, exact_check=False)
    for k, (twin, j) in est.removed.items():
        a = MinHash(num_perm=128, seed=1, hashfunc=shingle_hash32)
        b = MinHash(num_perm=128, seed=1, hashfunc=shingle_hash32)
        a.update_batch(shingles(by_key[k]))
        b.update_batch(shingles(by_key[twin]))
        assert a.jaccard(b) == pytest.approx(j) and j >= 0.8, (k, twin, j)
    print(f"estimate-only removed {len(est.removed)}")


def test_near_duplicates_point_to_the_kept_twin():
    docs = _chain(4, replace=20)
    res = fuzzy_dedup([f"c/{i}" for i in range(len(docs))], docs)
    assert {k: twin for k, (twin, _) in res.removed.items()} == {
        f"c/{i}": "c/0" for i in (1, 2, 3)}
    assert res.params["bands"] * res.params["rows"] <= 128


def test_duplicate_keys_rejected_and_tiny_inputs():
    with pytest.raises(ValueError, match="duplicate document keys"):
        fuzzy_dedup(["a", "a"], ["x", "y"])
    with pytest.raises(ValueError, match="3 texts for 2 keys"):
        fuzzy_dedup(["a", "b"], ["x", "y", "z"])
    assert fuzzy_dedup([], []).removed == {}
    assert fuzzy_dedup(["a", "b"], ["same words here", ""]).removed == {}


# --------------------------------------------------------------------------- Clough & Stevenson
def _decode(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("cp1252", errors="replace")
    # CRLF, CR and NEL (U+0085, and cp1252's 0x85 decoded as an ellipsis) line ends
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x85", "\n")


def _clough():
    root = corpora("neardup-clough-stevenson", "data")
    rows = list(csv.DictReader((root / "file_information.csv").open(encoding="utf-8")))
    texts = {}
    for task in "abcde":
        texts[f"cs/0-orig_task{task}"] = _decode((root / f"orig_task{task}.txt").read_bytes())
    labels = {}
    for r in rows:
        key = f"cs/1-{r['File'][:-4]}"
        texts[key] = _decode((root / r["File"]).read_bytes())
        labels[key] = (r["Category"], f"cs/0-orig_task{r['Task']}")
    return texts, labels


def _confusion(texts, labels, res):
    """An answer is found when it and its source end in the same duplicate group (kept
    document + its removed twins)."""
    def group(k):
        return res.removed[k][0] if k in res.removed else k

    found = defaultdict(int)
    total = defaultdict(int)
    for key, (cat, src) in labels.items():
        total[cat] += 1
        found[cat] += group(key) == group(src)
    return found, total


def test_clough_stevenson_confusion(ray_2cpu):
    """Default settings (Jaccard 0.8 on word 5-grams): prints the confusion table. Asserts
    what the data allows: no ``non`` answer is found, and every answer whose true shingle
    Jaccard with its source is at or above 0.85 is found."""
    texts, labels = _clough()
    keys = sorted(texts)
    res = fuzzy_dedup(keys, [texts[k] for k in keys])
    found, total = _confusion(texts, labels, res)
    print("\ncategory  answers  found-as-near-dup  true-J>=0.8  mean-true-J  "
          "containment>=0.5")
    for cat in ("cut", "light", "heavy", "non"):
        pairs = [(k, s) for k, (c, s) in labels.items() if c == cat]
        tj = [_true_jaccard(texts[k], texts[s]) for k, s in pairs]
        cont = [len(set(shingles(texts[k])) & set(shingles(texts[s])))
                / max(1, len(set(shingles(texts[k])))) for k, s in pairs]
        print(f"{cat:8s}  {total[cat]:7d}  {found[cat]:17d}  {sum(j >= 0.8 for j in tj):11d}"
              f"  {np.mean(tj):11.3f}  {sum(c >= 0.5 for c in cont):16d}")
    assert found["non"] == 0
    for key, (cat, src) in labels.items():
        if _true_jaccard(texts[key], texts[src]) >= 0.85:
            assert res.removed.get(key, (None,))[0] == src, (key, cat)


@pytest.mark.xfail(strict=True, reason=(
    "finding every cut answer and >=80% of light ones at default settings is not reachable by "
    "Jaccard near-dup detection on this corpus: answers are ~200-word excerpts of ~300-500 "
    "word sources (median cut Jaccard ~0.3), and 2 cut answers (g2pE_taskc, g4pD_taskb) "
    "share no word 5-gram with their source file at all"))
def test_clough_stevenson_finds_every_cut_and_most_light_answers(ray_2cpu):
    texts, labels = _clough()
    keys = sorted(texts)
    res = fuzzy_dedup(keys, [texts[k] for k in keys])
    found, total = _confusion(texts, labels, res)
    assert found["cut"] == total["cut"] and found["light"] >= 0.8 * total["light"]
    assert found["non"] == 0


def test_removals_do_not_depend_on_the_input_order():
    """Same removals and clusters for the input in order and shuffled."""
    docs = _cc_docs() + [(f"chain/{i}", t) for i, t in enumerate(_chain(8))]
    keys = [k for k, _ in docs]
    texts = [t for _, t in docs]
    results = [fuzzy_dedup(keys, texts)]
    perm = list(range(len(docs)))
    random.Random(3).shuffle(perm)
    results.append(fuzzy_dedup([keys[i] for i in perm], [texts[i] for i in perm]))
    first = results[0]
    assert first.removed
    for r in results[1:]:
        assert r.removed == first.removed
        assert r.cluster_sizes == first.cluster_sizes


def test_signature_input_errors():
    from tokenmill.pipeline.dedup.minhash import minhash_signatures

    with pytest.raises(ValueError, match="batch_size"):
        minhash_signatures(["a b c"], batch_size=0)
    with pytest.raises(TypeError, match="not a single str"):
        minhash_signatures("hello world")
    with pytest.raises(TypeError, match="document 3 is a NoneType"):
        minhash_signatures(["a", "b", "c", None], batch_size=2)
