"""Duplicate clusters from LSH candidate edges: union-find, then a check of every member
against the cluster's kept documents (no transitive chains; see the package docstring)."""

from __future__ import annotations

import numba
import numpy as np


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


def cluster_candidates(sig: np.ndarray, edges: np.ndarray, threshold: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Clusters of the candidate ``edges`` over ``n = len(sig)`` documents (in key order).

    Returns ``(twin, sim, sizes, kept_below)``: int64[n] the kept document each document
    duplicates (-1: kept), float64[n] its estimated Jaccard with it, int64[n] the size of
    the union-find cluster rooted at each index, and the number of cluster members kept
    although in a cluster (below ``threshold`` to every kept member).
    """
    n = sig.shape[0]
    twin = np.full(n, -1, np.int64)
    sim = np.zeros(n, np.float64)
    if not n:
        return twin, sim, np.empty(0, np.int64), 0
    root = _union_find(n, edges)
    sizes = np.bincount(root, minlength=n)
    in_cluster = np.flatnonzero(sizes[root] > 1)
    if not in_cluster.size:
        return twin, sim, sizes, 0
    grp = np.lexsort((in_cluster, root[in_cluster]))
    members = in_cluster[grp].astype(np.int64)
    r = root[members]
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    bounds = np.r_[starts, len(members)].astype(np.int64)
    _verify_clusters(sig, members, bounds, float(threshold), twin, sim)
    n_dups = int((twin >= 0).sum())
    return twin, sim, sizes, int(len(members) - n_dups - (len(bounds) - 1))
