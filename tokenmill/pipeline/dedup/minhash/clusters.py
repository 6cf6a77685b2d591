"""Duplicate clusters from LSH candidate edges: a check of every member
against kept documents of its cluster (no transitive chains; see the package docstring).

Two checks:

* :func:`verify_exact` (the default): the MinHash estimate only proposes; a member is
  removed only when the exact Jaccard of its shingle set (:mod:`.shingle_sets`) with a kept
  document is at or above the threshold. Each member is compared with at most
  ``max_representatives`` kept documents (the first ones of its cluster, in key order)
  plus, for each LSH band bucket it shares with an earlier document, that bucket's first
  document (or the kept document it was removed for): at most
  ``max_representatives + bands`` comparisons, so the time is linear in the cluster size.
* :func:`verify_estimate` (``exact_check=False``): the former check, a member removed when
  its *estimated* Jaccard with any kept document of the cluster reaches the threshold,
  compared with all of them (quadratic in a cluster of mutually dissimilar documents).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tokenmill.pipeline.dedup.minhash.shingle_sets import sorted_jaccard


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


@numba.njit(cache=True)
def _exact_member(i, cand, nc, sig, set_row, values, offsets, threshold, proposal, stats):
    """Compare member ``i`` with the kept documents ``cand[:nc]`` (ascending): the first
    whose estimate reaches ``proposal`` and whose exact Jaccard reaches ``threshold``.
    Returns (that document or -1, its exact Jaccard). stats: [exact checks, estimate
    >= threshold but exact below]."""
    P = sig.shape[1]
    ri = set_row[i]
    a = values[offsets[ri]:offsets[ri + 1]]
    for q in range(nc):
        r = cand[q]
        eq = 0
        for p in range(P):
            if sig[i, p] == sig[r, p]:
                eq += 1
        est = eq / P
        if est < proposal:
            continue
        rr = set_row[r]
        b = values[offsets[rr]:offsets[rr + 1]]
        la, lb = a.shape[0], b.shape[0]
        if min(la, lb) < threshold * max(la, lb):  # exact upper bound of the Jaccard
            j = min(la, lb) / max(la, lb)
        else:
            stats[0] += 1
            j = sorted_jaccard(a, b)
        if j >= threshold:
            return r, j
        if est >= threshold:
            stats[1] += 1
    return -1, 0.0


@numba.njit(cache=True)
def _verify_exact(sig, members, bounds, head_ptr, head_idx, set_row, values, offsets,
                  threshold, proposal, max_reps, twin, sim, stats):
    """:func:`verify_exact` over all clusters (arrays as there)."""
    n = sig.shape[0]
    mark = np.full(n, -1, np.int64)
    reps = np.empty(max(1, max_reps), np.int64)
    most_heads = 0
    for i in range(n):
        most_heads = max(most_heads, head_ptr[i + 1] - head_ptr[i])
    cand = np.empty(max(1, max_reps) + most_heads, np.int64)
    for c in range(bounds.shape[0] - 1):
        lo = bounds[c]
        hi = bounds[c + 1]
        nrep = 0
        for k in range(lo, hi):
            i = members[k]
            nc = 0
            for q in range(nrep):
                cand[nc] = reps[q]
                mark[reps[q]] = i
                nc += 1
            for e in range(head_ptr[i], head_ptr[i + 1]):
                h = head_idx[e]
                r = h if twin[h] < 0 else twin[h]
                if mark[r] != i:
                    mark[r] = i
                    cand[nc] = r
                    nc += 1
            cand[:nc].sort()
            found, j = _exact_member(i, cand, nc, sig, set_row, values, offsets,
                                     threshold, proposal, stats)
            twin[i] = found
            sim[i] = j
            if found < 0 and nrep < max_reps:
                reps[nrep] = i
                nrep += 1


def verify_estimate(sig: np.ndarray, members: np.ndarray, bounds: np.ndarray,
                    threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The estimate-only check (``exact_check=False``): ``(twin, sim)``, int64[n] the kept
    document each document duplicates (-1: kept) and float64[n] the *estimated* Jaccard
    (share of equal signature values) with it. Every member is compared with every kept
    document of its cluster."""
    n = sig.shape[0]
    twin = np.full(n, -1, np.int64)
    sim = np.zeros(n, np.float64)
    if len(members):
        _verify_clusters(sig, members, bounds, float(threshold), twin, sim)
    return twin, sim


def proposal_floor(threshold: float, num_perm: int) -> float:
    """The estimate at which a kept document is proposed for the exact check:
    ``threshold - 4 * sqrt(threshold * (1 - threshold) / num_perm)`` (4 standard
    deviations of the MinHash estimate of a pair at the threshold; 0.659 for 0.8/128),
    so a pair at or above the threshold is missed with probability < 1e-4."""
    return threshold - 4.0 * math.sqrt(threshold * (1.0 - threshold) / max(1, num_perm))


def verify_exact(sig: np.ndarray, members: np.ndarray, bounds: np.ndarray,
                 edges: np.ndarray, set_row: np.ndarray, values: np.ndarray,
                 offsets: np.ndarray, threshold: float, max_representatives: int = 32
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """The exact check: ``(twin, sim, counters)``.

    Args:
        sig: uint32[n, P] signatures (documents in key order).
        members, bounds: the members of the clusters of size >= 2, grouped by cluster,
            ascending inside each, and the clusters' start offsets plus the length.
        edges: int64[m, 2] LSH candidate edges ``(bucket's first document, member)``.
        set_row: int64[n], row of each cluster member in ``offsets`` (-1 elsewhere).
        values, offsets: the members' shingle sets from
            :func:`~tokenmill.pipeline.dedup.minhash.shingle_sets.shingle_sets`.
        threshold: exact Jaccard at or above which a member is removed.
        max_representatives: kept documents per cluster every member is compared with.

    Returns:
        ``twin`` int64[n] (kept document duplicated, -1: kept), ``sim`` float64[n] (exact
        Jaccard with it), ``counters``: ``exact_checks`` (pairs whose shingle sets were
        merged) and ``estimate_false_removals`` (pairs the estimate alone would have
        called duplicates but whose exact Jaccard is below the threshold).
    """
    n = sig.shape[0]
    twin = np.full(n, -1, np.int64)
    sim = np.zeros(n, np.float64)
    stats = np.zeros(2, np.int64)
    if len(members):
        by_member = np.lexsort((edges[:, 0], edges[:, 1]))
        head_idx = np.ascontiguousarray(edges[by_member, 0], dtype=np.int64)
        head_ptr = np.searchsorted(edges[by_member, 1], np.arange(n + 1)).astype(np.int64)
        proposal = proposal_floor(threshold, sig.shape[1])
        _verify_exact(sig, members, bounds, head_ptr, head_idx, set_row, values, offsets,
                      float(threshold), float(proposal), int(max_representatives), twin,
                      sim, stats)
    return twin, sim, {"exact_checks": int(stats[0]),
                       "estimate_false_removals": int(stats[1])}
