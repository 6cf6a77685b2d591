"""Connected components of the LSH candidate graph in hash partitions on Ray, for
:mod:`tokenmill.pipeline.dedup.fuzzy`: no task holds the whole graph.

Technique: the alternating large-star / small-star algorithm of Kiveris, Lattanzi,
Mirrokni, Rastogi & Vassilvitskii, "Connected Components in MapReduce and Beyond"
(SoCC 2014). Nodes are document ids (int64); an undirected edge is stored in both
directions, each row ``(u, v)`` in the partition of ``u`` (``mix64(u) mod P``). A round
reads partition ``p`` of every file of the previous round and, per node ``u`` with
neighbours ``Γ(u)``:

* large-star: ``m = min(Γ(u) ∪ {u})``; every neighbour ``v > u`` is linked to ``m``;
* small-star: ``m = min({v ∈ Γ(u): v < u} ∪ {u})``; those ``v`` and ``u`` are linked to ``m``.

Both keep every component connected and shrink it to a star around its smallest node;
rounds alternate (large, small, ...) until a round's input is all stars (every node has
either no smaller neighbour, or exactly one and no larger one), which the tasks count.
The number of rounds is O(log² n) in the worst case (Kiveris et al.), a handful on
near-duplicate graphs. A task holds the edges of its partition's nodes: about ``2|E|/P``
rows of 16 bytes, at least the largest degree.

Phases (files under ``work/dedup/``): ``cc_init`` (per partition: the unique candidate
edges of the members in it, from ``fuzzy_buckets``, in both directions), ``cc_round``
(per round and partition), ``cc_final`` (per partition: ``(id, label)`` of its nodes
grouped by block, and its candidate edges ``(head, member)`` grouped by the partition of
the member's label, label = the component's smallest id).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.run.intermediate import StageOutput, content_hash
from tokenmill.pipeline.run.partition_files import (
    cached,
    mix64,
    read_partitions,
    write_partitioned,
)
from tokenmill.pipeline.run.tasks import run_batches

VERSION = 1
_ROW_BITS = np.int64(32)


def node_partition(ids: np.ndarray, parts: int) -> np.ndarray:
    """int64 partition of int64 node ids (also the partition of a label)."""
    return (mix64(np.asarray(ids, np.int64).view(np.uint64)) % np.uint64(parts)).astype(np.int64)


@dataclass(frozen=True)
class ComponentsTask:
    """Partition ``p`` of a phase: its input files (``inputs`` of ``inputs_phase``), the
    bucket edges' files (``buckets``, for ``cc_init`` and ``cc_final``), the round's
    ``kind`` (``"large"`` or ``"small"``)."""

    work: str
    parts: int
    p: int
    digest: str
    buckets: tuple[str, ...] = ()
    inputs_phase: str = ""
    inputs: tuple[str, ...] = ()
    kind: str = ""
    n_blocks: int = 0


def _paths(work: str, phase: str, digests: tuple[str, ...]) -> list[Path]:
    return [StageOutput(work, phase, d).path(".arrow") for d in digests]


def _write_both(path: Path, a: np.ndarray, b: np.ndarray, parts: int) -> None:
    """The undirected edges ``a[i] - b[i]`` (no self loops), both directions, unique."""
    keep = a != b
    e = np.unique(np.stack([np.r_[a[keep], b[keep]], np.r_[b[keep], a[keep]]], 1), axis=0)
    e = e.reshape(-1, 2)
    write_partitioned(path, pa.table({"u": pa.array(e[:, 0]), "v": pa.array(e[:, 1])}),
                      node_partition(e[:, 0], parts), parts)


def _bucket_edges(task: ComponentsTask) -> np.ndarray:
    t = read_partitions(_paths(task.work, "fuzzy_buckets", task.buckets), task.p)
    e = np.stack([t.column("head").to_numpy(), t.column("member").to_numpy()], axis=1)
    return np.unique(e.reshape(-1, 2), axis=0)


def cc_init(task: ComponentsTask) -> dict[str, Any]:
    """Per partition: its members' unique candidate edges, in both directions."""
    out = StageOutput(task.work, "cc_init", task.digest)

    def compute() -> dict[str, Any]:
        e = _bucket_edges(task)
        _write_both(out.path(".arrow"), e[:, 0], e[:, 1], task.parts)
        return {"candidate_pairs": int(len(e))}
    return cached(out, compute)


def _grouped(task: ComponentsTask) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The input edges ``(u, v)`` of partition ``p``, unique, sorted by ``(u, v)``:
    ``(u, v, first, vmin)``, ``first`` marking each node's first row and ``vmin`` the
    smallest neighbour of the row's node."""
    t = read_partitions(_paths(task.work, task.inputs_phase, task.inputs), task.p)
    e = np.stack([t.column("u").to_numpy(), t.column("v").to_numpy()], axis=1)
    e = np.unique(e.reshape(-1, 2), axis=0)
    u, v = e[:, 0], e[:, 1]
    first = np.ones(len(u), bool)
    first[1:] = u[1:] != u[:-1]
    start = np.flatnonzero(first)[np.cumsum(first) - 1]
    return u, v, first, v[start]


def cc_round(task: ComponentsTask) -> dict[str, Any]:
    """One large-star or small-star round over partition ``p`` (``task.kind``); info
    ``not_star``: nodes of its *input* not yet in star shape."""
    out = StageOutput(task.work, "cc_round", task.digest)

    def compute() -> dict[str, Any]:
        u, v, first, vmin = _grouped(task)
        lower = v < u
        starts = np.flatnonzero(first)
        n_lower = np.add.reduceat(lower.astype(np.int64), starts) if len(u) else np.empty(0)
        n_upper = np.add.reduceat((~lower).astype(np.int64), starts) if len(u) else np.empty(0)
        not_star = int(((n_lower >= 2) | ((n_lower == 1) & (n_upper > 0))).sum())
        m = np.minimum(u, vmin)  # min of Γ(u) ∪ {u}, per row (= min of the lower ones)
        if task.kind == "large":
            a, b = v[~lower], m[~lower]
        else:
            a = np.r_[v[lower], u[first]]
            b = np.r_[m[lower], m[first]]
        _write_both(out.path(".arrow"), a, b, task.parts)
        return {"not_star": not_star, "edges": int(len(u))}
    return cached(out, compute)


def cc_final(task: ComponentsTask) -> dict[str, Any]:
    """Per partition, on star-shaped input: labels of its nodes (grouped by block) and its
    candidate edges (grouped by the partition of their label)."""
    out = StageOutput(task.work, "cc_final", task.digest)

    def compute() -> dict[str, Any]:
        u, v, first, vmin = _grouped(task)
        nodes, label = u[first], np.minimum(u, vmin)[first]
        write_partitioned(out.path(".members.arrow"),
                          pa.table({"id": pa.array(nodes), "label": pa.array(label)}),
                          nodes >> _ROW_BITS, task.n_blocks)
        e = _bucket_edges(task)  # members in this partition: their labels are here
        e_label = label[np.searchsorted(nodes, e[:, 1])]
        write_partitioned(out.path(".edges.arrow"),
                          pa.table({"head": pa.array(e[:, 0]), "member": pa.array(e[:, 1])}),
                          node_partition(e_label, task.parts), task.parts)
        return {"candidate_clusters": int((nodes == label).sum())}
    return cached(out, compute, (".members.arrow", ".edges.arrow"))


def components(work: str, parts: int, buckets: list[str], n_blocks: int, progress: bool,
               max_rounds: int = 200) -> tuple[list[str], dict[str, int]]:
    """Run the phases over the ``fuzzy_buckets`` files ``buckets`` (under ``work``, in
    ``parts`` partitions); returns the ``cc_final`` digests (one per partition) and the
    counters ``candidate_pairs``, ``candidate_clusters`` and ``rounds``.

    Raises:
        RuntimeError: no convergence in ``max_rounds`` rounds (cannot happen for a finite
            graph; a guard against a bug looping forever).
    """
    src, bk = content_hash(buckets), tuple(buckets)
    tasks = [ComponentsTask(work, parts, p, content_hash("cc_init", VERSION, p, parts, src),
                            buckets=bk) for p in range(parts)]
    infos = run_batches(cc_init, tasks, "fuzzy dedup: components", progress)
    pairs = sum(x["candidate_pairs"] for x in infos)
    phase, inputs = "cc_init", tuple(t.digest for t in tasks)
    for r in range(max_rounds):
        kind = "large" if r % 2 == 0 else "small"
        prev = content_hash(phase, list(inputs))
        tasks = [ComponentsTask(work, parts, p,
                                content_hash("cc_round", VERSION, r, kind, p, parts, prev),
                                inputs_phase=phase, inputs=inputs, kind=kind)
                 for p in range(parts)]
        infos = run_batches(cc_round, tasks, f"fuzzy dedup: components round {r + 1}",
                            progress)
        if sum(x["not_star"] for x in infos) == 0:
            break
        phase, inputs = "cc_round", tuple(t.digest for t in tasks)
    else:
        raise RuntimeError(f"connected components: no convergence in {max_rounds} rounds")
    prev = content_hash(phase, list(inputs))
    tasks = [ComponentsTask(work, parts, p,
                            content_hash("cc_final", VERSION, p, parts, prev, src, n_blocks),
                            buckets=bk, inputs_phase=phase, inputs=inputs, n_blocks=n_blocks)
             for p in range(parts)]
    infos = run_batches(cc_final, tasks, "fuzzy dedup: component labels", progress)
    return [t.digest for t in tasks], {
        "candidate_pairs": pairs, "rounds": r + 1,
        "candidate_clusters": sum(x["candidate_clusters"] for x in infos)}
