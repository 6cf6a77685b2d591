"""MinHash-LSH fuzzy deduplication, with the hashing vectorized in numba and LSH bands
grouped on Ray.

Technique: Broder, "On the resemblance and containment of documents" (1997) for
MinHash; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3 for LSH
banding; the false-positive/false-negative weighted choice of (bands, rows) is
datasketch's ``_optimal_param``; the pipeline shape (signatures, band buckets, union-find
clusters) follows datatrove's and NeMo Curator's fuzzy dedup.

API (what the executor calls)
-----------------------------
``fuzzy_dedup(keys, texts, threshold=0.8, ngram=5, num_perm=128, seed=1,
exact_check=True)`` -> :class:`FuzzyDedupResult`. ``keys`` are the unique document keys of
    a whole datamix (after exact dedup), ``texts`` the matching texts (in the same order;
    the candidates' texts are read again for the exact check). ``result.removed`` maps each
    removed key to ``(kept_key, exact jaccard)``
    (quarantine each with ``stage="fuzzy_dedup"``, ``reason="fuzzy_dedup:near_duplicate"``,
    ``duplicate_of=kept_key``); ``result.params`` (num_perm, bands, rows, threshold, ngram,
    seed, hash, scheme, FP/FN weights) goes into the manifest; ``result.counters``
    (documents, empty, candidate_pairs, candidate_clusters, removed,
    kept_below_threshold, seconds) are the stage counters, e.g.
    ``stages["fuzzy_dedup"] = {"removed": n_removed_from_this_source, "params": ...}``
    (the report reads ``removed`` or ``rejected``); ``result.cluster_sizes`` lists the size
    of every duplicate cluster (kept document + its removed twins). The result does not
    depend on the order of the inputs or on the number of Ray workers. Ray: uses the
    running Ray (if none is initialized, a new local one with at most 2 CPUs:
    ``address="local"``, never a cluster joined by accident); signatures are computed in the
    calling process (numba, one thread; about 57,000 documents per CPU-second on
    linux-docs + cc-main, see benchmarks/bench_minhash.py).

:class:`FuzzyDedup` wraps the same call as a :class:`~tokenmill.pipeline.stage.PipelineStep`
(``name = "fuzzy_dedup"``, reason ``"fuzzy_dedup:near_duplicate"``, ``duplicate_of`` =
kept key, ``detail`` = ``"jaccard=0.912 (exact)"``); it holds all documents of its input in memory.

Lower-level pieces: :func:`normalize_for_shingles`, :func:`shingles` (reference, for
tests and peers), :func:`minhash_signatures` (``(n_docs, num_perm)`` uint32),
:func:`shingle_hash32` / :func:`word_hash32` / :func:`fmix32` (the hashes in pure
Python), :func:`to_minhash` / :func:`to_lean_minhash` (datasketch objects),
:func:`lsh_params`.

Modules
-------
:mod:`.reference` (pure-Python shingles and hashes), :mod:`.kernels` (numba),
:mod:`.signatures` (batches through the kernel; datasketch objects), :mod:`.lsh` (band
parameters, candidate edges on Ray), :mod:`.exact` (exact shingle sets), :mod:`.clusters`
(union-find and the threshold check);
this module holds the API and the stage.

Shingles
--------
Word ``ngram``-grams of :func:`normalize_for_shingles`: each character replaced by its
NFKC form, lower-cased, and words are maximal runs of alphanumeric characters. The numba
kernel does all of it from the UTF-8 bytes in one pass (tables built once per process).

datasketch interoperability
---------------------------
Signatures are bit-identical to
``datasketch.MinHash(num_perm, seed, hashfunc=shingle_hash32, scheme="affine32")`` updated
with the UTF-8 bytes of every shingle (``" ".join(words[i:i + ngram])``): the shingle's
32-bit hash (:func:`shingle_hash32`, a polynomial of its words' MurmurHash64A hashes),
datasketch's fmix32 pre-mix, then ``a * h + b mod 2**32`` with datasketch's own
permutation parameters. ``to_lean_minhash(sig[i], seed)`` gives a
``LeanMinHash`` usable in ``datasketch.MinHashLSH``.

No transitive blow-up, removal on an exact check
------------------------------------------------
LSH candidates are joined into clusters by union-find, but a cluster is never removed
wholesale. Its members are visited in key order; the first is kept. Every later member is
removed only if the *exact* Jaccard of its shingle set with a document already kept in
the cluster is at or above ``threshold`` (its twin is the lowest-key such document among
those compared); otherwise it is kept too and may become a representative that later
members are compared with. A chain A~B~C~D where A and D are unrelated therefore keeps A
and C. The MinHash estimate only proposes: a kept document is checked exactly when the
estimate is within 4 standard deviations below the threshold
(:func:`.clusters.proposal_floor`). Shingle sets (:mod:`.exact`: sorted unique 64-bit
shingle hashes, collision-free in practice) are computed for the cluster members only.
A member is compared with at most ``max_representatives`` kept documents of its cluster
(the first ones) plus the first document of each LSH bucket it shares with an earlier
document (or the kept document that one was removed for): at most
``max_representatives + bands`` comparisons per member, linear in the cluster size. A
near duplicate whose kept twin is none of these is kept (a false negative, never a
false removal). ``exact_check=False`` restores the former decision: removal on the
estimate, each member compared with every kept document of its cluster.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenmill.pipeline.dedup.minhash.clusters import (
    union_find_clusters,
    verify_estimate,
    verify_exact,
)
from tokenmill.pipeline.dedup.minhash.lsh import band_edges, lsh_candidate_edges, lsh_params
from tokenmill.pipeline.dedup.minhash.reference import (
    HASH_NAME,
    MAX_HASH32,
    MURMUR64A_M,
    SCHEME,
    SHINGLE_BASE,
    fmix32,
    murmur64a,
    normalize_for_shingles,
    shingle_hash32,
    shingles,
    word_hash32,
)
from tokenmill.pipeline.dedup.minhash.shingle_sets import shingle_sets
from tokenmill.pipeline.dedup.minhash.signatures import (
    minhash_signatures,
    to_lean_minhash,
    to_minhash,
)
from tokenmill.pipeline.stage import Document, PipelineStep

__all__ = [
    "HASH_NAME", "MAX_HASH32", "MURMUR64A_M", "SCHEME", "SHINGLE_BASE", "FuzzyDedup",
    "FuzzyDedupResult", "band_edges", "candidate_shingle_sets", "fmix32", "fuzzy_dedup",
    "fuzzy_dedup_signatures", "fuzzy_params",
    "jaccard_detail", "shingle_sets",
    "lsh_candidate_edges", "lsh_params", "minhash_signatures", "murmur64a",
    "normalize_for_shingles", "shingle_hash32", "shingles", "to_lean_minhash", "to_minhash",
    "word_hash32",
]

@dataclass
class FuzzyDedupResult:
    """Outcome of :func:`fuzzy_dedup`.

    ``removed``: removed key -> (kept key, Jaccard: exact with ``exact_check``, else the
    MinHash estimate); ``params``: the settings to record in the manifest;
    ``cluster_sizes``: size of each duplicate cluster (kept document + removed twins,
    >= 2), descending; ``counters``: documents, empty, candidate_pairs,
    candidate_clusters, removed, kept_below_threshold, seconds, and with ``exact_check``
    exact_checks and estimate_false_removals.
    """

    removed: dict[str, tuple[str, float]]
    params: dict[str, Any]
    cluster_sizes: list[int] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    def is_removed(self, key: str) -> bool:
        return key in self.removed


def jaccard_detail(jaccard: float, exact_check: bool) -> str:
    """The quarantine ``detail`` of a near duplicate: ``"jaccard=0.912 (exact)"``, or the
    former ``"jaccard=0.912"`` (an estimate) when ``exact_check`` is off."""
    return f"jaccard={jaccard:.3f} (exact)" if exact_check else f"jaccard={jaccard:.3f}"


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
    exact_check: bool = True,
    max_representatives: int = 32,
) -> FuzzyDedupResult:
    """MinHash-LSH near-duplicate removal over a whole collection.

    Args:
        keys: unique document keys; the kept document of a cluster is the lowest key.
        texts: the documents' texts, same order and length as ``keys``. With
            ``exact_check`` the candidates' texts are read a second time: a sequence is
            indexed, any other iterable is first held as a list.
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
        exact_check: remove a document only when the exact Jaccard of its shingle set
            with a kept document reaches ``threshold`` (the estimate only proposes; see
            :mod:`.clusters`). ``False``: the former estimate-only decision.
        max_representatives: with ``exact_check``, the kept documents of a cluster that
            every member is compared with (besides its LSH bucket heads).

    Returns:
        :class:`FuzzyDedupResult`.

    Raises:
        ValueError: duplicate keys, ``len(texts) != len(keys)``, bad threshold, or
            ``bands * rows > num_perm``.
    """
    keys = list(keys)
    n = len(keys)
    bands, rows = _checked(keys, threshold, num_perm, bands, rows, false_positive_weight,
                           false_negative_weight)
    t0 = time.perf_counter()
    if exact_check and not isinstance(texts, Sequence):
        texts = list(texts)
    it: Iterable[str] = texts
    if progress:
        from tqdm import tqdm

        it = tqdm(texts, total=n, desc="minhash", unit="doc")
    sig, nsh = minhash_signatures(it, num_perm=num_perm, seed=seed, ngram=ngram,
                                  return_shingle_counts=True)
    if sig.shape[0] != n:
        raise ValueError(f"fuzzy_dedup: {sig.shape[0]} texts for {n} keys")
    seq = texts

    def texts_of(idx: np.ndarray) -> Iterator[str]:
        return (seq[i] for i in idx)  # type: ignore[index]

    result = fuzzy_dedup_signatures(
        keys, sig, nsh, threshold=threshold, ngram=ngram, seed=seed, bands=bands, rows=rows,
        false_positive_weight=false_positive_weight,
        false_negative_weight=false_negative_weight, n_tasks=n_tasks,
        exact_check=exact_check, texts_of=texts_of, max_representatives=max_representatives)
    result.counters["seconds"]["signatures"] = round(time.perf_counter() - t0, 3) - sum(
        v for k, v in result.counters["seconds"].items() if k != "signatures")
    return result


def _checked(keys: list[str], threshold: float, num_perm: int, bands: int | None,
             rows: int | None, fp_weight: float, fn_weight: float) -> tuple[int, int]:
    """The (bands, rows) to use; ValueError on duplicate keys, a bad threshold or
    ``bands * rows > num_perm``."""
    if len(set(keys)) != len(keys):
        dup = [k for k, c in Counter(keys).items() if c > 1][:3]
        raise ValueError(f"fuzzy_dedup: duplicate document keys, e.g. {dup}")
    if bands is None or rows is None:
        bands, rows = lsh_params(threshold, num_perm, fp_weight, fn_weight)
    if bands * rows > num_perm:
        raise ValueError(f"bands*rows = {bands}*{rows} exceeds num_perm = {num_perm}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    return bands, rows


def candidate_shingle_sets(texts: Iterable[str], n: int, ngram: int, batch: int = 4096
                           ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shingle_sets` of ``n`` texts, ``batch`` at a time (only one batch's texts
    held at once). Raises ValueError when ``texts`` does not yield exactly ``n``."""
    it = iter(texts)
    values, offsets, base = [], [np.zeros(1, np.int64)], 0
    while chunk := list(itertools.islice(it, batch)):
        v, o = shingle_sets(chunk, ngram)
        values.append(v)
        offsets.append(o[1:] + base)
        base += len(v)
    off = np.concatenate(offsets)
    if len(off) - 1 != n:
        raise ValueError(f"fuzzy_dedup: {len(off) - 1} candidate texts for {n} candidates")
    return (np.concatenate(values) if values else np.empty(0, np.uint64)), off


def fuzzy_dedup_signatures(
    keys: Sequence[str], sig: np.ndarray, nsh: np.ndarray, threshold: float = 0.8,
    ngram: int = 5, seed: int = 1, bands: int | None = None, rows: int | None = None,
    false_positive_weight: float = 0.2, false_negative_weight: float = 0.8,
    n_tasks: int | None = None, exact_check: bool = True,
    texts_of: Callable[[np.ndarray], Iterable[str]] | None = None,
    max_representatives: int = 32,
) -> FuzzyDedupResult:
    """:func:`fuzzy_dedup` from precomputed signatures (the executor computes them per
    block on Ray workers and holds only ``num_perm * 4`` bytes per document).

    Args:
        keys: unique document keys, length n.
        sig: uint32[n, num_perm] from :func:`minhash_signatures` (same ngram and seed).
        nsh: int64[n] shingle counts (0 = too short to compare; never a duplicate).
        exact_check, max_representatives: as in :func:`fuzzy_dedup`.
        texts_of: with ``exact_check``, called once with the int64 ascending indices
            (into ``keys``) of the candidates (members of LSH clusters); yields their
            texts in that order. Only the candidates' shingle sets are held (8 bytes per
            distinct shingle).

    Raises:
        ValueError: shapes disagree, ``exact_check`` without ``texts_of``, or
            ``max_representatives < 0``.
    """
    keys = list(keys)
    n = len(keys)
    num_perm = int(sig.shape[1]) if sig.ndim == 2 else 0
    if sig.shape[0] != n or len(nsh) != n:
        raise ValueError(f"fuzzy_dedup: {sig.shape[0]} signatures for {n} keys")
    if exact_check and texts_of is None:
        raise ValueError("fuzzy_dedup: exact_check needs texts_of (the candidates' texts)")
    if max_representatives < 0:
        raise ValueError(f"max_representatives must be >= 0, got {max_representatives}")
    if bands is None or rows is None:
        bands, rows = lsh_params(threshold, num_perm, false_positive_weight,
                                 false_negative_weight)
    t1 = time.perf_counter()
    # documents in key order: index = rank of the key
    order = np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)
    sig = np.ascontiguousarray(sig[order])
    valid = nsh[order] > 0
    if int(valid.sum()) >= 2:
        edges = lsh_candidate_edges(sig, valid, bands, rows, n_tasks=n_tasks)
    else:  # nothing to compare: no need for Ray
        edges = np.empty((0, 2), np.int64)
    t2 = time.perf_counter()
    sizes, members, bounds = union_find_clusters(n, edges)
    extra: dict[str, int] = {}
    if exact_check:
        twin, sim, extra = _verify_exactly(sig, order, members, bounds, edges, ngram,
                                           threshold, texts_of, max_representatives)
    else:
        twin, sim = verify_estimate(sig, members, bounds, threshold)
    dups = np.flatnonzero(twin >= 0)
    removed: dict[str, tuple[str, float]] = {
        keys[order[i]]: (keys[order[twin[i]]], float(sim[i])) for i in dups}
    per_kept = np.bincount(twin[dups], minlength=n)
    cluster_sizes = sorted((per_kept[per_kept > 0] + 1).tolist(), reverse=True)
    t3 = time.perf_counter()
    params = fuzzy_params(num_perm, bands, rows, threshold, ngram, seed,
                          false_positive_weight, false_negative_weight, exact_check,
                          max_representatives)
    counters = {"documents": n, "empty": int((~valid).sum()),
                "candidate_pairs": int(len(edges)),
                "candidate_clusters": int((sizes > 1).sum()) if n else 0,
                "removed": len(removed),
                "kept_below_threshold": int(len(members) - len(dups) - (len(bounds) - 1)),
                **extra,
                "seconds": {"signatures": 0.0, "lsh": round(t2 - t1, 3),
                            "clusters": round(t3 - t2, 3)}}
    return FuzzyDedupResult(removed=removed, params=params, cluster_sizes=cluster_sizes,
                            counters=counters)


def fuzzy_params(num_perm: int, bands: int, rows: int, threshold: float, ngram: int,
                 seed: int, false_positive_weight: float = 0.2,
                 false_negative_weight: float = 0.8, exact_check: bool = True,
                 max_representatives: int = 32) -> dict[str, Any]:
    """The settings of a fuzzy dedup run as the manifest records them
    (:attr:`FuzzyDedupResult.params`)."""
    params = {"num_perm": num_perm, "bands": bands, "rows": rows, "threshold": threshold,
              "ngram": ngram, "seed": seed, "hash": HASH_NAME, "scheme": SCHEME,
              "false_positive_weight": false_positive_weight,
              "false_negative_weight": false_negative_weight}
    if exact_check:  # (absent when off: the former manifest record, byte for byte)
        params |= {"exact_check": True, "max_representatives": max_representatives}
    return params


def _verify_exactly(sig, order, members, bounds, edges, ngram, threshold, texts_of,
                    max_representatives):
    """Shingle sets of the cluster members (read through ``texts_of`` in input order),
    then :func:`verify_exact`."""
    n = len(order)
    wanted = np.sort(order[members])  # input indices of the candidates
    values, offsets = candidate_shingle_sets(texts_of(wanted), len(wanted), ngram)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    set_row = np.full(n, -1, np.int64)
    set_row[rank[wanted]] = np.arange(len(wanted))
    return verify_exact(sig, members, bounds, edges, set_row, values, offsets, threshold,
                        max_representatives)


class FuzzyDedup(PipelineStep):
    """MinHash-LSH near-duplicate removal as a stage (see :func:`fuzzy_dedup`).

    It reads its whole input before yielding (a global stage), then yields the kept
    documents in input order and rejects the others with reason
    ``"fuzzy_dedup:near_duplicate"``, ``duplicate_of`` = the kept key and
    ``detail`` = :func:`jaccard_detail` (``"jaccard=0.912 (exact)"``). After running,
    ``self.result`` holds the :class:`FuzzyDedupResult` (its ``params`` belong in the manifest).
    """

    name = "fuzzy_dedup"
    version = 1

    def __init__(self, threshold: float = 0.8, ngram: int = 5, num_perm: int = 128,
                 seed: int = 1, bands: int | None = None, rows: int | None = None,
                 false_positive_weight: float = 0.2,
                 false_negative_weight: float = 0.8, exact_check: bool = True,
                 max_representatives: int = 32) -> None:
        super().__init__(threshold=threshold, ngram=ngram, num_perm=num_perm, seed=seed,
                         bands=bands, rows=rows, false_positive_weight=false_positive_weight,
                         false_negative_weight=false_negative_weight,
                         exact_check=exact_check, max_representatives=max_representatives)
        self.result: FuzzyDedupResult | None = None

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        docs = list(docs)
        self.result = fuzzy_dedup([d.key for d in docs], [d.text for d in docs],
                                  **self.config)
        for d in docs:
            hit = self.result.removed.get(d.key)
            if hit is None:
                yield d
            else:
                self.reject(d, "fuzzy_dedup:near_duplicate", duplicate_of=hit[0],
                            detail=jaccard_detail(hit[1], self.config["exact_check"]))
