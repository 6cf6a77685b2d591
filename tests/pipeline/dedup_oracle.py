"""The single-process dedup decisions: the test oracle of the partitioned dedup that
``tokenmill run`` runs (:mod:`tokenmill.pipeline.dedup.exact`,
:mod:`tokenmill.pipeline.dedup.fuzzy`).

One process holds a 16-byte hash and a key per document (exact dedup) and ``num_perm * 4``
bytes and a key per exact-unique document (fuzzy dedup), so this is for tests and
benchmarks only. The decisions are the same as the partitioned ones for any partition
count: exact dedup keeps the first occurrence in the global order; fuzzy dedup clusters
LSH candidates by union-find, visits each cluster in key order and removes a member
only if its exact shingle Jaccard with a kept document of its cluster reaches the
threshold (see :mod:`tokenmill.pipeline.dedup.minhash`); an exact duplicate of a
document fuzzy dedup removed points to the document actually kept.

API: :func:`fuzzy_dedup` (keys and texts of a whole collection), :func:`fuzzy_dedup_signatures`
(from precomputed signatures), :func:`exact_decide` / :func:`fuzzy_decide` (over the
prepared blocks' columns, as the stages compute them), :func:`component_roots`
(union-find components, the oracle of the partitioned components).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from tqdm import tqdm

from tokenmill.pipeline.dedup.fuzzy import read_signatures
from tokenmill.pipeline.dedup.minhash import (
    candidate_shingle_sets,
    fuzzy_params,
    jaccard_detail,
    lsh_params,
    minhash_signatures,
)
from tokenmill.pipeline.dedup.minhash.clusters import verify_estimate, verify_exact
from tokenmill.pipeline.dedup.minhash.lsh import band_edges

#: per block, removed key -> [kept key, stage name, detail or None]
Removals = dict[str, list]


class BlockColumns:
    """Read access to the blocks' stored columns, for the reference decisions.

    ``read(i, columns)`` returns a ``pyarrow.Table`` of block ``i`` (columns ``key`` and
    the asked ones, documents in order); ``len()`` is the number of blocks."""

    def __init__(self, n_blocks: int, read: Callable[[int, list[str]], Any]) -> None:
        self.n_blocks = n_blocks
        self._read = read

    def __len__(self) -> int:
        return self.n_blocks

    def read(self, index: int, columns: list[str]) -> Any:
        return self._read(index, columns)


def exact_decide(blocks: BlockColumns, removals: list[Removals], name: str = "exact_dedup",
                 progress: bool = False) -> None:
    """Exact dedup: the first occurrence of a hash in the global order is kept; adds the
    later ones to ``removals`` (per block, removed key -> [kept key, stage, None])."""
    first: dict[bytes, str] = {}
    for i in tqdm(range(len(blocks)), desc="exact dedup", unit="block",
                  disable=not progress):
        t = blocks.read(i, ["key", "hash"])
        d = removals[i]
        for k, h in zip(t.column("key").to_pylist(), t.column("hash").to_pylist(),
                        strict=True):
            kept = first.setdefault(h, k)
            if kept != k:
                d[k] = [kept, name, None]


def _gather(num_perm: int, blocks: BlockColumns, removals: list[Removals],
            progress: bool):
    keys_all: list[str] = []
    sigs, counts, owner, starts = [], [], {}, [0]
    for i in tqdm(range(len(blocks)), desc="fuzzy dedup", unit="block",
                  disable=not progress):
        t = blocks.read(i, ["key", "minhash", "shingles"])
        keys = t.column("key").to_pylist()
        sig, nsh = read_signatures(t, num_perm)
        keep = [j for j, k in enumerate(keys) if k not in removals[i]]
        keys_all += [keys[j] for j in keep]
        sigs.append(sig[keep])
        counts.append(nsh[keep])
        owner.update({keys[j]: i for j in keep})
        starts.append(len(keys_all))
    sig = np.concatenate(sigs) if sigs else np.empty((0, num_perm), np.uint32)
    nsh = np.concatenate(counts) if counts else np.empty(0, np.int64)
    return keys_all, sig, nsh, owner, starts


def _texts_of(blocks: BlockColumns, removals: list[Removals], starts: list[int]):
    """``texts_of`` for the exact check: the texts of the gathered documents at the
    ascending indices ``idx``, read block by block (only the candidates' blocks)."""
    def texts_of(idx: np.ndarray):
        block_of = np.searchsorted(starts, idx, side="right") - 1
        for i in np.unique(block_of):
            t = blocks.read(int(i), ["key", "text"])
            keys = t.column("key").to_pylist()
            rows = [j for j, k in enumerate(keys) if k not in removals[i]]
            texts = t.column("text")
            for g in idx[block_of == i] - starts[i]:
                yield texts[rows[g]].as_py()
    return texts_of


def fuzzy_decide(config: dict[str, Any], blocks: BlockColumns, removals: list[Removals],
                 name: str = "fuzzy_dedup", progress: bool = False) -> dict[str, Any]:
    """Adds the near duplicates to ``removals``; returns the manifest record
    (``params``, ``counters``, ``cluster_sizes``: size -> clusters)."""
    f = config
    keys_all, sig, nsh, owner, starts = _gather(f["num_perm"], blocks, removals, progress)
    res = fuzzy_dedup_signatures(keys_all, sig, nsh, threshold=f["threshold"],
                                 ngram=f["ngram"], seed=f["seed"],
                                 exact_check=f["exact_check"],
                                 texts_of=_texts_of(blocks, removals, starts))
    for key, (kept, jac) in sorted(res.removed.items()):
        removals[owner[key]][key] = [kept, name,
                                     jaccard_detail(jac, f["exact_check"])]
    # an exact duplicate of a document that fuzzy dedup then removed points to the
    # document actually kept (its text equals the removed one's, so it is as similar)
    for d in removals:
        for entry in d.values():
            if entry[1] != name and entry[0] in res.removed:
                entry[2] = f"same text as {entry[0]}"
                entry[0] = res.removed[entry[0]][0]
    counters = {k: v for k, v in res.counters.items() if k != "seconds"}
    sizes = res.cluster_sizes
    return {"params": res.params, "counters": counters,
            "cluster_sizes": {str(s): sizes.count(s) for s in sorted(set(sizes))}}


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
        false_negative_weight=false_negative_weight,
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


def fuzzy_dedup_signatures(
    keys: Sequence[str], sig: np.ndarray, nsh: np.ndarray, threshold: float = 0.8,
    ngram: int = 5, seed: int = 1, bands: int | None = None, rows: int | None = None,
    false_positive_weight: float = 0.2, false_negative_weight: float = 0.8,
    exact_check: bool = True,
    texts_of: Callable[[np.ndarray], Iterable[str]] | None = None,
    max_representatives: int = 32,
) -> FuzzyDedupResult:
    """:func:`fuzzy_dedup` from precomputed signatures (the executor computes them per
    block and holds only ``num_perm * 4`` bytes per document).

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
        edges = band_edges(sig, valid, 0, bands, rows)
    else:
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


def component_roots(n: int, edges: np.ndarray) -> np.ndarray:
    """int64[n]: for every node ``0..n-1`` the smallest node of its connected component
    under the int64 ``(m, 2)`` ``edges`` (union-find with path halving)."""
    if not n:
        return np.empty(0, np.int64)
    return _union_find(n, np.ascontiguousarray(edges, dtype=np.int64)).astype(np.int64)


def union_find_clusters(n: int, edges: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union-find clusters of the candidate ``edges`` (int64 ``(m, 2)``) over ``n``
    documents (indices in key order).

    Returns ``(sizes, members, bounds)``: int64[n] the size of the cluster rooted at each
    index; int64 the members of the clusters of size >= 2, grouped by cluster, ascending
    inside each; int64 the clusters' start offsets in ``members`` plus its length.
    """
    if not n:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.zeros(1, np.int64)
    root = _union_find(n, edges)
    sizes = np.bincount(root, minlength=n)
    in_cluster = np.flatnonzero(sizes[root] > 1)
    grp = np.lexsort((in_cluster, root[in_cluster]))
    members = in_cluster[grp].astype(np.int64)
    r = root[members]
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]]) if len(r) else np.empty(0, int)
    return sizes, members, np.r_[starts, len(members)].astype(np.int64)
