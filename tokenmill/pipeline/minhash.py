"""MinHash-LSH fuzzy deduplication, with the hashing vectorized in numba and LSH bands
grouped on Ray.

Technique: Broder, "On the resemblance and containment of documents" (1997) for
MinHash; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3 for LSH
banding; the false-positive/false-negative weighted choice of (bands, rows) is
datasketch's ``_optimal_param``; the pipeline shape (signatures, band buckets, union-find
clusters) follows datatrove's and NeMo Curator's fuzzy dedup.

API (what the executor calls)
-----------------------------
``fuzzy_dedup(keys, texts, threshold=0.8, ngram=5, num_perm=128, seed=1)``
    -> :class:`FuzzyDedupResult`. ``keys`` are the unique document keys of a whole datamix
    (after exact dedup), ``texts`` the matching texts (any iterable, read once, in the
    same order). ``result.removed`` maps each removed key to ``(kept_key, jaccard)``;
    ``result.params`` (num_perm, bands, rows, threshold, ngram, seed, hash, scheme) goes
    into the manifest; ``result.counters`` are the stage counters; ``result.cluster_sizes``
    lists the size of every duplicate cluster (kept document + its removed twins).
    The result does not depend on the order of the inputs or on the number of Ray workers.

:class:`FuzzyDedup` wraps the same call as a :class:`~tokenmill.pipeline.step.PipelineStep`
(``name = "fuzzy_dedup"``, reason ``"fuzzy_dedup:near_duplicate"``, ``duplicate_of`` =
kept key, ``detail`` = ``"jaccard=0.912"``); it holds all documents of its input in memory.

Lower-level pieces: :func:`normalize_for_shingles`, :func:`shingles` (reference, for
tests and peers), :func:`minhash_signatures` (``(n_docs, num_perm)`` uint32),
:func:`shingle_hash32` / :func:`murmur3_32` (the shingle hash in pure Python), :func:`to_minhash` /
:func:`to_lean_minhash` (datasketch objects), :func:`lsh_params`.

datasketch interoperability
---------------------------
Signatures are bit-identical to
``datasketch.MinHash(num_perm, seed, hashfunc=shingle_hash32, scheme="affine32")`` updated
with the UTF-8 bytes of every shingle (``" ".join(words[i:i + ngram])``): the shingle's
32-bit hash (:func:`shingle_hash32`, MurmurHash3 of its words' MurmurHash3 values),
datasketch's fmix32 pre-mix, then ``a * h + b mod 2**32`` with datasketch's own
permutation parameters. ``to_lean_minhash(sig[i], seed)`` gives a
``LeanMinHash`` usable in ``datasketch.MinHashLSH``.

No transitive blow-up
---------------------
LSH candidates are joined into clusters by union-find, but a cluster is never removed
wholesale. Its members are visited in key order; the first is kept. Every later member is
removed only if its estimated Jaccard (share of equal signature values) with a document
already kept in the cluster is at or above ``threshold`` (its twin is the lowest-key such
document); otherwise it is kept too and becomes a representative that later members may
duplicate. A chain A~B~C~D where A and D are unrelated therefore keeps A and C.
"""

from __future__ import annotations

import functools
import os
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from tokenmill.pipeline.step import Document, PipelineStep

MAX_HASH32 = np.uint32(0xFFFFFFFF)
SCHEME = "affine32"
HASH_NAME = ("shingle_hash32: murmur3_32 of the words' murmur3_32 values; "
             "datasketch affine32 permutations")

_NON_WORD = re.compile(r"[\W_]+")


# ---------------------------------------------------------------------------------------
# normalization and shingles
# ---------------------------------------------------------------------------------------
def normalize_for_shingles(text: str) -> str:
    """Text as the words MinHash sees: NFKC, lower case, every run of non-word characters
    (punctuation, whitespace, ``_``) replaced by one space, stripped.

    The result is the words joined by single spaces (possibly ``""``).
    """
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def _prepare(text: str) -> bytes:
    # the Python half of normalize_for_shingles; word splitting happens in the kernel
    return unicodedata.normalize("NFKC", text).lower().encode("utf-8", "surrogatepass")


def shingles(text: str, ngram: int = 5) -> list[bytes]:
    """Reference shingling (pure Python; the fast path is :func:`minhash_signatures`).

    Word ``ngram``-grams of :func:`normalize_for_shingles`, each as UTF-8 bytes of the
    words joined by one space. A document with fewer than ``ngram`` (but at least one)
    words is one shingle; an empty document has none.
    """
    words = normalize_for_shingles(text).split(" ")
    if words == [""]:
        return []
    n = max(1, len(words) - ngram + 1)
    return [" ".join(words[i:i + ngram]).encode("utf-8") for i in range(n)]


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 (Austin Appleby, public domain) of ``data``, as a Python int.

    Pure Python reference; :func:`shingle_hash32` builds the shingle hash from it.
    """
    c1, c2, m = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & m
    n = len(data)
    nblocks = n // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        k = (k * c2) & m
        h ^= k
        h = ((h << 13) | (h >> 19)) & m
        h = (h * 5 + 0xE6546B64) & m
    tail = data[4 * nblocks:]
    k = 0
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        k = (k * c2) & m
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    h ^= h >> 16
    return h


def shingle_hash32(shingle: bytes) -> int:
    """The 32-bit hash of a shingle (UTF-8 words joined by one space): MurmurHash3_x86_32
    (seed 0) of the concatenated little-endian 32-bit MurmurHash3 values of its words.

    Hashing words once and shingles from word hashes makes each shingle cost ``ngram``
    block mixes instead of re-hashing its bytes. Pass it as ``hashfunc`` to
    ``datasketch.MinHash`` to reproduce :func:`minhash_signatures`.
    """
    words = shingle.split(b" ")
    return murmur3_32(b"".join(murmur3_32(w).to_bytes(4, "little") for w in words))


# ---------------------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _fmix32(h):
    m = np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    return h


@functools.lru_cache(maxsize=1)
def _word_char_table() -> np.ndarray:
    """bool (0x110000,): code point is alphanumeric (``str.isalnum``, i.e. regex
    ``[^\\W_]``). Built once per process (~0.2 s)."""
    return np.array([chr(i).isalnum() for i in range(0x110000)], dtype=np.bool_)


@numba.njit(inline="always")
def _mix_block(h, k):
    m = np.uint64(0xFFFFFFFF)
    k = (k * np.uint64(0xCC9E2D51)) & m
    k = ((k << np.uint64(15)) | (k >> np.uint64(17))) & m
    k = (k * np.uint64(0x1B873593)) & m
    h ^= k
    h = ((h << np.uint64(13)) | (h >> np.uint64(19))) & m
    return (h * np.uint64(5) + np.uint64(0xE6546B64)) & m


@numba.njit(inline="always")
def _mix_tail(h, k):
    m = np.uint64(0xFFFFFFFF)
    k = (k * np.uint64(0xCC9E2D51)) & m
    k = ((k << np.uint64(15)) | (k >> np.uint64(17))) & m
    k = (k * np.uint64(0x1B873593)) & m
    return h ^ k


@numba.njit(cache=True, nogil=True)
def _word_hashes(buf, s, e, table, wh):
    """One pass over UTF-8 ``buf[s:e]``: the MurmurHash3_x86_32 (seed 0) of every word (a
    maximal run of code points with ``table[cp]``) into ``wh`` (uint64, room for
    ``(e - s + 1) // 2`` words). Returns the number of words."""
    nw = 0
    in_word = False
    h = np.uint64(0)
    k = np.uint64(0)
    nb = 0
    i = s
    while i <= e:
        if i < e:
            c0 = np.int64(buf[i])
            if c0 < 0x80:
                ln = 1
                cp = c0
            else:
                if c0 < 0xE0:
                    ln = 2
                    cp = c0 & 0x1F
                elif c0 < 0xF0:
                    ln = 3
                    cp = c0 & 0x0F
                else:
                    ln = 4
                    cp = c0 & 0x07
                if i + ln > e:
                    ln = e - i
                for q in range(1, ln):
                    cp = (cp << 6) | (np.int64(buf[i + q]) & 0x3F)
                if cp >= 0x110000:
                    cp = 0  # malformed: a separator (table[0] is False)
            is_word = table[cp]
        else:
            ln = 1
            is_word = False  # end of document closes the last word
        if is_word:
            if not in_word:
                in_word = True
                h = np.uint64(0)
                k = np.uint64(0)
                nb = 0
            for q in range(ln):
                k |= np.uint64(buf[i + q]) << np.uint64(8 * (nb & 3))
                nb += 1
                if nb & 3 == 0:
                    h = _mix_block(h, k)
                    k = np.uint64(0)
        elif in_word:
            in_word = False
            if nb & 3:
                h = _mix_tail(h, k)
            h ^= np.uint64(nb)
            wh[nw] = _fmix32(h)
            nw += 1
        i += ln
    return nw


@numba.njit(cache=True, nogil=True)
def _shingle_minhash(wh, nw, ngram, a, b, sig):
    """Minimum over the shingles of ``a * fmix32(H) + b mod 2**32`` into ``sig`` (uint32
    (P,), preset to 0xFFFFFFFF), H = :func:`shingle_hash32` computed from the word hashes
    ``wh[:nw]``. Returns the number of shingles."""
    if nw == 0:
        return 0
    P = a.shape[0]
    nsh = nw - ngram + 1
    if nsh < 1:
        nsh = 1
    for w in range(nsh):
        last = w + ngram
        if last > nw:
            last = nw
        h = np.uint64(0)
        for q in range(w, last):
            h = _mix_block(h, wh[q])
        h ^= np.uint64(4 * (last - w))
        hv = np.uint32(_fmix32(_fmix32(h)))  # murmur3 finalizer, then datasketch's pre-mix
        # uint32 wrap-around is the affine32 "mod 2**32"; min() keeps the loop SIMD
        for p in range(P):
            sig[p] = min(sig[p], np.uint32(a[p] * hv + b[p]))
    return nsh


@numba.njit(cache=True, nogil=True)
def _signatures_kernel(buf, doc_off, ngram, a, b, table, out, n_shingles):
    """buf: uint8 UTF-8 (lower-cased NFKC) of all docs; doc_off: int64 (n_docs + 1,);
    a, b: uint32 (P,) datasketch affine32 permutations; table: bool word-char table; out:
    uint32 (n_docs, P); n_shingles: int64 (n_docs,)."""
    n_docs = doc_off.shape[0] - 1
    longest = 1
    for d in range(n_docs):
        longest = max(longest, doc_off[d + 1] - doc_off[d])
    wh = np.empty(longest // 2 + 2, np.uint64)
    for d in range(n_docs):
        nw = _word_hashes(buf, doc_off[d], doc_off[d + 1], table, wh)
        sig = out[d]
        sig[:] = np.uint32(0xFFFFFFFF)
        n_shingles[d] = _shingle_minhash(wh, nw, ngram, a, b, sig)


@functools.lru_cache(maxsize=16)
def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
    return a.astype(np.uint32), b.astype(np.uint32)


def minhash_signatures(
    texts: Iterable[str],
    num_perm: int = 128,
    seed: int = 1,
    ngram: int = 5,
    batch_size: int = 2048,
    return_shingle_counts: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """MinHash signatures of ``texts``.

    Returns a ``(n_docs, num_perm)`` uint32 array (with ``return_shingle_counts`` also an
    int64 ``(n_docs,)`` array of shingle counts). An empty document's row is all
    ``0xFFFFFFFF`` (datasketch's empty MinHash). Bit-identical to datasketch (see module
    docstring). Per document, Python only applies NFKC and ``lower``; word splitting and
    hashing (one pass over the bytes), shingle hashes and the minimum over permutations
    run in one numba kernel per batch.

    Raises:
        ValueError: ``num_perm`` or ``ngram`` < 1.
    """
    if num_perm < 1 or ngram < 1:
        raise ValueError(f"num_perm and ngram must be >= 1, got {num_perm}, {ngram}")
    a, b = _permutations(num_perm, seed)
    table = _word_char_table()
    parts: list[np.ndarray] = []
    counts: list[np.ndarray] = []

    def flush(batch: list[bytes]) -> None:
        lens = np.fromiter((len(x) for x in batch), np.int64, len(batch))
        off = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        buf = np.frombuffer(b"".join(batch), np.uint8)
        out = np.empty((len(batch), num_perm), np.uint32)
        nsh = np.empty(len(batch), np.int64)
        _signatures_kernel(buf, off, ngram, a, b, table, out, nsh)
        parts.append(out)
        counts.append(nsh)

    batch: list[bytes] = []
    for t in texts:
        batch.append(_prepare(t))
        if len(batch) >= batch_size:
            flush(batch)
            batch = []
    if batch:
        flush(batch)
    sig = np.concatenate(parts) if parts else np.empty((0, num_perm), np.uint32)
    if return_shingle_counts:
        return sig, (np.concatenate(counts) if counts else np.empty(0, np.int64))
    return sig


def to_minhash(signature: np.ndarray, seed: int = 1):
    """A ``datasketch.MinHash`` (scheme affine32, hashfunc :func:`shingle_hash32`) holding
    ``signature`` (uint32 ``(num_perm,)``); ``update`` on it continues consistently."""
    from datasketch import MinHash

    a, b = _permutations(len(signature), seed)
    return MinHash(seed=seed, hashfunc=shingle_hash32, hashvalues=np.asarray(signature),
                   permutations=(a, b), scheme=SCHEME)


def to_lean_minhash(signature: np.ndarray, seed: int = 1):
    """A ``datasketch.LeanMinHash`` of ``signature`` (for ``MinHashLSH`` and storage)."""
    from datasketch import LeanMinHash

    return LeanMinHash(seed=seed, hashvalues=np.asarray(signature), scheme=SCHEME)


@functools.lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int, false_positive_weight: float = 0.2,
               false_negative_weight: float = 0.8) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm`` minimizing the weighted
    integrated false-positive and false-negative probability of the LSH S-curve
    ``1 - (1 - s**rows)**bands`` around ``threshold`` (datasketch ``_optimal_param``).

    Raises:
        ValueError: threshold outside (0, 1) or weights not summing to 1.
    """
    from datasketch.lsh import _optimal_param

    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if abs(false_positive_weight + false_negative_weight - 1.0) > 1e-9:
        raise ValueError("false_positive_weight + false_negative_weight must be 1")
    b, r = _optimal_param(threshold, num_perm, false_positive_weight, false_negative_weight)
    return int(b), int(r)


# ---------------------------------------------------------------------------------------
# LSH bands on Ray
# ---------------------------------------------------------------------------------------
def band_edges(sig: np.ndarray, valid: np.ndarray, band_lo: int, band_hi: int,
               rows: int) -> np.ndarray:
    """Candidate edges of bands ``[band_lo, band_hi)``.

    For every band, documents whose ``rows`` signature values in that band are all equal
    share a bucket; each bucket member is linked to the bucket's lowest index. Returns an
    int64 ``(m, 2)`` array of ``(lowest index, member index)``, unique, sorted. Rows with
    ``valid == False`` (empty documents) take part in no bucket.
    """
    idx_valid = np.flatnonzero(valid)
    out = []
    for band in range(band_lo, band_hi):
        block = np.ascontiguousarray(sig[idx_valid, band * rows:(band + 1) * rows])
        if block.shape[0] < 2:
            continue
        keys = block.view(np.dtype((np.void, block.dtype.itemsize * rows))).ravel()
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        new_group = np.ones(len(sk), bool)
        new_group[1:] = sk[1:] != sk[:-1]
        group_id = np.cumsum(new_group) - 1
        first_pos = np.flatnonzero(new_group)
        first = order[first_pos][group_id]
        member = order
        dup = ~new_group
        if dup.any():
            e = np.stack([idx_valid[first[dup]], idx_valid[member[dup]]], axis=1)
            out.append(e)
    if not out:
        return np.empty((0, 2), np.int64)
    return np.unique(np.concatenate(out).astype(np.int64), axis=0)


def _ray_band_edges(sig, valid, band_lo, band_hi, rows):
    return band_edges(sig, valid, band_lo, band_hi, rows)


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=min(2, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)


def lsh_candidate_edges(sig: np.ndarray, valid: np.ndarray, bands: int, rows: int,
                        n_tasks: int | None = None) -> np.ndarray:
    """All LSH candidate edges, bands split over Ray tasks (``ray.init`` with at most 2
    CPUs if Ray is not running). Same result for any ``n_tasks``/worker count: int64
    ``(m, 2)``, unique, sorted."""
    import ray

    _ensure_ray()
    if n_tasks is None:
        n_tasks = max(1, int(ray.cluster_resources().get("CPU", 1)))
    n_tasks = max(1, min(n_tasks, bands))
    remote = ray.remote(num_cpus=1)(_ray_band_edges)
    sig_ref = ray.put(sig)
    valid_ref = ray.put(valid)
    bounds = np.linspace(0, bands, n_tasks + 1).astype(int)
    futs = [remote.remote(sig_ref, valid_ref, int(lo), int(hi), rows)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]
    parts = ray.get(futs)
    if not parts:
        return np.empty((0, 2), np.int64)
    return np.unique(np.concatenate(parts), axis=0)


@numba.njit(cache=True)
def _union_find(n, edges):
    parent = np.arange(n)
    for k in range(edges.shape[0]):
        x = edges[k, 0]
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        y = edges[k, 1]
        while parent[y] != y:
            parent[y] = parent[parent[y]]
            y = parent[y]
        if x < y:
            parent[y] = x
        elif y < x:
            parent[x] = y
    for i in range(n):
        r = i
        while parent[r] != r:
            r = parent[r]
        parent[i] = r
    return parent


@numba.njit(cache=True)
def _verify_clusters(sig, members, bounds, threshold, twin, sim):
    """members: indices grouped by cluster (ascending inside each), bounds: cluster
    starts (+ end). Sets twin[i] = kept representative (or -1 if i is kept), sim[i]."""
    P = sig.shape[1]
    reps = np.empty(members.shape[0], np.int64)
    for c in range(bounds.shape[0] - 1):
        lo = bounds[c]
        hi = bounds[c + 1]
        nrep = 1
        reps[0] = members[lo]
        twin[members[lo]] = -1
        for k in range(lo + 1, hi):
            i = members[k]
            found = -1
            best = 0.0
            for q in range(nrep):
                r = reps[q]
                eq = 0
                for p in range(P):
                    if sig[i, p] == sig[r, p]:
                        eq += 1
                j = eq / P
                if j >= threshold:
                    found = r
                    best = j
                    break
            if found >= 0:
                twin[i] = found
                sim[i] = best
            else:
                twin[i] = -1
                reps[nrep] = i
                nrep += 1


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------
@dataclass
class FuzzyDedupResult:
    """Outcome of :func:`fuzzy_dedup`.

    ``removed``: removed key -> (kept key, estimated Jaccard); ``params``: the settings to
    record in the manifest; ``cluster_sizes``: size of each duplicate cluster (kept
    document + removed twins, >= 2), descending; ``counters``: documents, empty,
    candidate_pairs, candidate_clusters, removed, kept_below_threshold and seconds.
    """

    removed: dict[str, tuple[str, float]]
    params: dict[str, Any]
    cluster_sizes: list[int] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    def is_removed(self, key: str) -> bool:
        return key in self.removed


def fuzzy_dedup(
    keys: Sequence[str],
    texts: Iterable[str],
    threshold: float = 0.8,
    ngram: int = 5,
    num_perm: int = 128,
    seed: int = 1,
    bands: int | None = None,
    rows: int | None = None,
    false_positive_weight: float = 0.2,
    false_negative_weight: float = 0.8,
    n_tasks: int | None = None,
    progress: bool = False,
) -> FuzzyDedupResult:
    """MinHash-LSH near-duplicate removal over a whole collection.

    Args:
        keys: unique document keys; the kept document of a cluster is the lowest key.
        texts: the documents' texts, same order and length as ``keys`` (read once).
        threshold: Jaccard threshold on word ``ngram`` shingles (LSH tuning and the
            removal check).
        num_perm, seed: MinHash size and datasketch permutation seed.
        bands, rows: LSH banding; by default :func:`lsh_params` of threshold/num_perm
            with the two weights below.
        false_positive_weight, false_negative_weight: weights of the integrated FP and
            FN probabilities. The default (0.2, 0.8) favours recall because every LSH
            candidate is verified against the threshold afterwards, so a false positive
            costs only a comparison: for 0.8/128 it gives 12 bands x 10 rows (candidate
            probability 0.74 at Jaccard 0.8, 0.93 at 0.85, 0.99 at 0.9), where the
            unweighted optimum (9 x 13) finds only 0.69 of pairs at 0.85.
        n_tasks: Ray tasks for the band grouping (default: cluster CPUs); no effect on
            the result.
        progress: show a tqdm bar while hashing.

    Returns:
        :class:`FuzzyDedupResult`.

    Raises:
        ValueError: duplicate keys, ``len(texts) != len(keys)``, bad threshold, or
            ``bands * rows > num_perm``.
    """
    keys = list(keys)
    n = len(keys)
    if len(set(keys)) != n:
        dup = [k for k, c in Counter(keys).items() if c > 1][:3]
        raise ValueError(f"fuzzy_dedup: duplicate document keys, e.g. {dup}")
    if bands is None or rows is None:
        bands, rows = lsh_params(threshold, num_perm, false_positive_weight,
                                 false_negative_weight)
    if bands * rows > num_perm:
        raise ValueError(f"bands*rows = {bands}*{rows} exceeds num_perm = {num_perm}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    t0 = time.perf_counter()
    it: Iterable[str] = texts
    if progress:
        from tqdm import tqdm

        it = tqdm(texts, total=n, desc="minhash", unit="doc")
    sig, nsh = minhash_signatures(it, num_perm=num_perm, seed=seed, ngram=ngram,
                                  return_shingle_counts=True)
    if sig.shape[0] != n:
        raise ValueError(f"fuzzy_dedup: {sig.shape[0]} texts for {n} keys")
    t1 = time.perf_counter()
    # documents in key order: index = rank of the key
    order = np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)
    sig = np.ascontiguousarray(sig[order])
    valid = nsh[order] > 0
    edges = lsh_candidate_edges(sig, valid, bands, rows, n_tasks=n_tasks)
    t2 = time.perf_counter()
    root = _union_find(n, edges) if n else np.empty(0, np.int64)
    sizes = np.bincount(root, minlength=n) if n else np.empty(0, np.int64)
    in_cluster = np.flatnonzero(sizes[root] > 1)
    removed: dict[str, tuple[str, float]] = {}
    cluster_sizes: list[int] = []
    kept_below = 0
    if in_cluster.size:
        grp = np.lexsort((in_cluster, root[in_cluster]))
        members = in_cluster[grp].astype(np.int64)
        r = root[members]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        bounds = np.r_[starts, len(members)].astype(np.int64)
        twin = np.full(n, -1, np.int64)
        sim = np.zeros(n, np.float64)
        _verify_clusters(sig, members, bounds, float(threshold), twin, sim)
        dups = np.flatnonzero(twin >= 0)
        for i in dups:
            removed[keys[order[i]]] = (keys[order[twin[i]]], float(sim[i]))
        per_kept = np.bincount(twin[dups], minlength=n)
        cluster_sizes = sorted((per_kept[per_kept > 0] + 1).tolist(), reverse=True)
        kept_below = int(len(members) - len(dups) - (len(bounds) - 1))
    t3 = time.perf_counter()
    params = {"num_perm": num_perm, "bands": bands, "rows": rows, "threshold": threshold,
              "ngram": ngram, "seed": seed, "hash": HASH_NAME, "scheme": SCHEME,
              "false_positive_weight": false_positive_weight,
              "false_negative_weight": false_negative_weight}
    counters = {"documents": n, "empty": int((~valid).sum()),
                "candidate_pairs": int(len(edges)),
                "candidate_clusters": int((sizes > 1).sum()) if n else 0,
                "removed": len(removed), "kept_below_threshold": kept_below,
                "seconds": {"signatures": round(t1 - t0, 3), "lsh": round(t2 - t1, 3),
                            "clusters": round(t3 - t2, 3)}}
    return FuzzyDedupResult(removed=removed, params=params, cluster_sizes=cluster_sizes,
                            counters=counters)


class FuzzyDedup(PipelineStep):
    """MinHash-LSH near-duplicate removal as a stage (see :func:`fuzzy_dedup`).

    It reads its whole input before yielding (a global stage), then yields the kept
    documents in input order and rejects the others with reason
    ``"fuzzy_dedup:near_duplicate"``, ``duplicate_of`` = the kept key and
    ``detail = "jaccard=<estimate>"``. After running, ``self.result`` holds the
    :class:`FuzzyDedupResult` (its ``params`` belong in the manifest).
    """

    name = "fuzzy_dedup"
    version = 1

    def __init__(self, threshold: float = 0.8, ngram: int = 5, num_perm: int = 128,
                 seed: int = 1, bands: int | None = None, rows: int | None = None,
                 false_positive_weight: float = 0.2,
                 false_negative_weight: float = 0.8) -> None:
        super().__init__(threshold=threshold, ngram=ngram, num_perm=num_perm, seed=seed,
                         bands=bands, rows=rows, false_positive_weight=false_positive_weight,
                         false_negative_weight=false_negative_weight)
        self.result: FuzzyDedupResult | None = None

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        docs = list(docs)
        self.result = fuzzy_dedup([d.key for d in docs], (d.text for d in docs),
                                  **self.config)
        for d in docs:
            hit = self.result.removed.get(d.key)
            if hit is None:
                yield d
            else:
                self.reject(d, "fuzzy_dedup:near_duplicate", duplicate_of=hit[0],
                            detail=f"jaccard={hit[1]:.3f}")
