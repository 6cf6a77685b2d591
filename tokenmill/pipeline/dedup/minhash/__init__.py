"""MinHash-LSH fuzzy deduplication, with the hashing vectorized in numba and LSH bands
grouped on Ray.

Technique: Broder, "On the resemblance and containment of documents" (1997) for
MinHash; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3 for LSH
banding; the false-positive/false-negative weighted choice of (bands, rows) is
datasketch's ``_optimal_param``; the pipeline shape (signatures, band buckets, union-find
components) follows datatrove's and NeMo Curator's fuzzy dedup.

What runs
---------
``tokenmill run`` decides fuzzy dedup in hash partitions
(:mod:`tokenmill.pipeline.dedup.fuzzy`): signatures per block
(:func:`minhash_signatures`, numba, one thread; about 57,000 documents per CPU-second on
linux-docs + cc-main, see benchmarks/bench_minhash.py), LSH bands (:func:`lsh_params`),
connected components of the candidate graph, then the check of every cluster member
(:mod:`.clusters`). A removed document is quarantined with ``stage="fuzzy_dedup"``,
``reason="fuzzy_dedup:duplicate"``, ``duplicate_of`` = the kept key and ``detail`` =
:func:`jaccard_detail`; the manifest records :func:`fuzzy_params` and the counters.

Lower-level pieces: :func:`normalize_for_shingles`, :func:`shingles` (reference, for
tests and peers), :func:`minhash_signatures` (``(n_docs, num_perm)`` uint32),
:func:`shingle_hash32` / :func:`word_hash32` / :func:`fmix32` (the hashes in pure
Python), :func:`to_minhash` / :func:`to_lean_minhash` (datasketch objects),
:func:`lsh_params`.

Modules
-------
:mod:`.reference` (pure-Python shingles and hashes), :mod:`.kernels` (numba),
:mod:`.signatures` (batches through the kernel; datasketch objects), :mod:`.lsh` (band
parameters, candidate edges of bands), :mod:`.shingle_sets` (exact shingle sets),
:mod:`.clusters` (the threshold check of a cluster's members); this module holds the
manifest's parameters and the quarantine detail.

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
LSH candidates are joined into clusters (connected components), but a cluster is never
removed wholesale. Its members are visited in key order; the first is kept. Every later member is
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
from collections.abc import Iterable
from typing import Any

import numpy as np

from tokenmill.pipeline.dedup.minhash.lsh import band_edges, lsh_params
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

__all__ = [
    "HASH_NAME", "MAX_HASH32", "MURMUR64A_M", "SCHEME", "SHINGLE_BASE",
    "band_edges", "candidate_shingle_sets", "fmix32", "fuzzy_params",
    "jaccard_detail", "shingle_sets", "lsh_params", "minhash_signatures", "murmur64a",
    "normalize_for_shingles", "shingle_hash32", "shingles", "to_lean_minhash", "to_minhash",
    "word_hash32",
]


def jaccard_detail(jaccard: float, exact_check: bool) -> str:
    """The quarantine ``detail`` of a near duplicate: ``"jaccard=0.912 (exact)"``, or the
    former ``"jaccard=0.912"`` (an estimate) when ``exact_check`` is off."""
    return f"jaccard={jaccard:.3f} (exact)" if exact_check else f"jaccard={jaccard:.3f}"


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


def fuzzy_params(num_perm: int, bands: int, rows: int, threshold: float, ngram: int,
                 seed: int, false_positive_weight: float = 0.2,
                 false_negative_weight: float = 0.8, exact_check: bool = True,
                 max_representatives: int = 32) -> dict[str, Any]:
    """The settings of a fuzzy dedup run as the manifest records them
    (``fuzzy_dedup.params``)."""
    params = {"num_perm": num_perm, "bands": bands, "rows": rows, "threshold": threshold,
              "ngram": ngram, "seed": seed, "hash": HASH_NAME, "scheme": SCHEME,
              "false_positive_weight": false_positive_weight,
              "false_negative_weight": false_negative_weight}
    if exact_check:  # (absent when off: the former manifest record, byte for byte)
        params |= {"exact_check": True, "max_representatives": max_representatives}
    return params


