"""MinHash-LSH fuzzy dedup, a global stage, decided in hash partitions on Ray with no
per-document state on the driver (tested against a single-process oracle with the
tests).

The phases are map/reduce steps over files in ``work/dedup/<phase>/`` (Arrow IPC,
:mod:`tokenmill.pipeline.run.partition_files`). ``P`` is the datamix's
``dedup.partitions``; a document's id is ``block index << 32 | row``. Only the documents
the earlier global stages kept take part:

1. ``fuzzy_map`` (per block): one row ``(band, band values, id, key)`` per LSH band of
   every document with at least one shingle, partitioned by a hash of (band, values).
2. ``fuzzy_buckets`` (per partition): rows sorted by (band, values, key); inside a bucket
   every member is linked to the bucket's lowest key: the candidate edges
   ``(head, member)`` of :func:`~tokenmill.pipeline.dedup.minhash.lsh.band_edges`.
3. components (:mod:`tokenmill.pipeline.dedup.components`, per partition, a few rounds):
   the unique candidate edges (``candidate_pairs``) and their connected components by
   alternating large-star / small-star rounds; members ``(id, component)`` grouped by
   block, edges grouped by the component's partition (``candidate_clusters``).
4. ``fuzzy_gather`` (per block): the members' key, signature, text (and content hash).
5. ``fuzzy_verify`` (per component partition): whole components, members in key order,
   :func:`~tokenmill.pipeline.dedup.minhash.clusters.verify_exact` (or ``verify_estimate``):
   a member is removed only if its exact shingle Jaccard with a kept document of its
   component reaches the threshold; the lowest key is kept. Components are independent,
   so this equals the single-process decision for any ``P``.
6. ``join`` (per partition): the removals, grouped by block. When the earlier decision
   is exact dedup's (``same_text_by_hash``), the verify removals are partitioned by
   content hash, and an exact duplicate of a document this stage removed is re-pointed
   to the document actually kept (detail ``same text as ...``).

Memory. A map task holds one block. A reduce task (``fuzzy_buckets``, ``join``) holds
its partition: about ``1/P`` of all rows of its phase (buckets: ``bands`` rows of ~90
bytes, ~1.1 KB a document at 12 bands), so raising ``P`` bounds it.
``fuzzy_verify`` holds the whole components hashed to its partition (their members'
texts and signatures): ``1/P`` of the candidate documents on average, but never less
than the largest component. A components round holds the candidate edges of its
partition's documents (``2|E|/P`` rows of 16 bytes on average, at least the largest
degree); no task holds the whole candidate graph, and nothing scales with the documents
that have no near-duplicate candidate beyond the map and bucket rows.
The driver holds per block and per partition a digest (file name) and small counters,
and the fuzzy record (params, counters, cluster-size histogram); never a key or a hash.

Every phase's output is content-addressed (its inputs' digests, :data:`VERSION`, the
stage's fingerprint and ``P``) and committed with checksums, so a rerun reuses every
complete partition. The decisions, the manifest record and the per-block removals do not
depend on ``P`` or on the number of Ray workers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tokenmill.pipeline.dedup.components import components, node_partition
from tokenmill.pipeline.dedup.exact import hash_partition
from tokenmill.pipeline.dedup.minhash import (
    candidate_shingle_sets,
    fuzzy_params,
    jaccard_detail,
    minhash_signatures,
)
from tokenmill.pipeline.dedup.minhash.clusters import verify_estimate, verify_exact
from tokenmill.pipeline.dedup.minhash.lsh import lsh_params
from tokenmill.pipeline.run.intermediate import StageOutput, content_hash, work_file
from tokenmill.pipeline.run.partition_files import (
    cached,
    fixed_width,
    mix64,
    read_partition,
    read_partitions,
    write_partitioned,
)
from tokenmill.pipeline.run.prepare_task import read_block_columns
from tokenmill.pipeline.run.removals import REMOVALS, Shuffle, removal_file
from tokenmill.pipeline.run.tasks import run_batches
from tokenmill.pipeline.stage import Document, GlobalContext, GlobalDecision, GlobalStage

#: part of every phase's content address: bump when a phase's output changes
VERSION = 2
_ROW_BITS = np.int64(32)
_ROW_MASK = np.int64(0xFFFFFFFF)
#: kept documents every member is compared with
MAX_REPRESENTATIVES = 32


def read_signatures(table: pa.Table, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint32[n, num_perm] MinHash signatures, int64[n] shingle counts) of a block's
    ``minhash`` and ``shingles`` columns."""
    col = table.column("minhash").combine_chunks()
    raw = col.buffers()[1]
    sig = np.frombuffer(raw, dtype="<u4", count=len(col) * num_perm,
                        offset=col.offset * 4 * num_perm).reshape(len(col), num_perm)
    return sig, table.column("shingles").to_numpy()


@dataclass(frozen=True)
class FuzzySettings:
    """What every task of one fuzzy decision shares: the shuffle, the LSH banding and
    the check's settings, and ``has_hash``: the blocks have exact dedup's ``hash``
    column and the removals are joined with its decision by content hash."""

    run: Shuffle
    num_perm: int
    bands: int
    rows: int
    threshold: float
    ngram: int
    exact_check: bool
    has_hash: bool


@dataclass(frozen=True)
class BlockTask:
    """A per-block task: block ``block`` (prepared block ``prepare``); ``inputs``: the
    digests of the earlier phase's files it reads (``cc_final`` for ``fuzzy_gather``)."""

    fuzzy: FuzzySettings
    block: int
    prepare: str
    digest: str
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionTask:
    """A per-partition task: partition ``p`` of the earlier phases' files ``inputs``
    (``fuzzy_map`` for buckets, ``fuzzy_gather`` for verify, ``fuzzy_verify`` for
    join) and ``cc`` (the components, for verify); ``earlier``: for ``join``, the
    earlier decision's file of this partition to re-point, if any."""

    fuzzy: FuzzySettings
    p: int
    digest: str
    inputs: tuple[str, ...]
    cc: tuple[str, ...] = ()
    earlier: str | None = None
    stage: str = ""


def _paths(work: str, phase: str, digests: tuple[str, ...], suffix: str = ".arrow"):
    return [StageOutput(work, phase, d).path(suffix) for d in digests]


def _band_rows(sig: np.ndarray, bands: int, rows: int, parts: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For documents' signatures uint32[m, num_perm]: per (band, document), band-major,
    the band index (int16), the band's values as bytes (uint8[bands * m, 4 * rows]) and
    the partition of (band, values) (int64)."""
    m = sig.shape[0]
    s = np.ascontiguousarray(sig[:, :bands * rows].reshape(m, bands, rows).transpose(1, 0, 2))
    h = np.broadcast_to(mix64(np.arange(1, bands + 1, dtype=np.uint64))[:, None], (bands, m))
    for k in range(rows):
        h = mix64(h ^ s[:, :, k].astype(np.uint64))
    values = s.astype("<u4").view(np.uint8).reshape(bands * m, 4 * rows)
    band = np.repeat(np.arange(bands, dtype=np.int16), m)
    return band, values, (h.ravel() % np.uint64(parts)).astype(np.int64)


def fuzzy_map(task: BlockTask) -> dict[str, Any]:
    """Per block: a row per (LSH band, document with shingles) of the documents the
    earlier global stages kept, partitioned by (band, band values)."""
    f, run = task.fuzzy, task.fuzzy.run
    out = StageOutput(run.work, "fuzzy_map", task.digest)

    def compute() -> dict[str, Any]:
        t = read_block_columns(run.prepare_work, task.prepare, ["key", "minhash", "shingles"])
        sig, nsh = read_signatures(t, f.num_perm)
        keep = np.ones(len(t), bool)
        keep[run.removed_rows(task.block)] = False
        idx = np.flatnonzero(keep & (nsh > 0))
        band, values, part = _band_rows(sig[idx], f.bands, f.rows, run.parts)
        ids = (np.int64(task.block) << _ROW_BITS) | idx.astype(np.int64)
        bucket = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(4 * f.rows), len(band), [None, pa.py_buffer(values.tobytes())])
        keys = t.column("key").take(pa.array(np.tile(idx, f.bands), pa.int64()))
        table = pa.table({"band": pa.array(band), "bucket": bucket,
                          "id": pa.array(np.tile(ids, f.bands)), "key": keys})
        write_partitioned(out.path(".arrow"), table, part, run.parts)
        return {"documents": int(keep.sum()), "empty": int((keep & (nsh == 0)).sum())}
    return cached(out, compute)


def fuzzy_buckets(task: PartitionTask) -> dict[str, Any]:
    """Per bucket partition: candidate edges ``(head, member)``, every member of a bucket
    linked to the bucket's lowest key; written grouped by a hash of the member."""
    run = task.fuzzy.run
    out = StageOutput(run.work, "fuzzy_buckets", task.digest)

    def compute() -> dict[str, Any]:
        t = read_partitions(_paths(run.work, "fuzzy_map", task.inputs), task.p)
        order = pc.sort_indices(t, sort_keys=[("band", "ascending"), ("bucket", "ascending"),
                                              ("key", "ascending")]).to_numpy()
        band = t.column("band").to_numpy()[order]
        width = t.schema.field("bucket").type.byte_width
        values = fixed_width(t.column("bucket"), width)[order]
        ids = t.column("id").to_numpy()[order]
        new = np.ones(len(order), bool)
        new[1:] = (band[1:] != band[:-1]) | (values[1:] != values[:-1]).any(axis=1)
        head = ids[np.flatnonzero(new)][np.cumsum(new) - 1]
        edges = np.unique(np.stack([head[~new], ids[~new]], axis=1).reshape(-1, 2), axis=0)
        table = pa.table({"head": pa.array(edges[:, 0]), "member": pa.array(edges[:, 1])})
        part = node_partition(edges[:, 1], run.parts)
        write_partitioned(out.path(".arrow"), table, part, run.parts)
        return {"edges": int(len(edges))}
    return cached(out, compute)


def fuzzy_gather(task: BlockTask) -> dict[str, Any]:
    """Per block: the candidate documents' key, signature, content hash and (with the
    exact check) text, grouped by component partition."""
    f, run = task.fuzzy, task.fuzzy.run
    out = StageOutput(run.work, "fuzzy_gather", task.digest)

    def compute() -> dict[str, Any]:
        m = read_partitions(_paths(run.work, "cc_final", task.inputs, ".members.arrow"),
                            task.block)
        rows = (m.column("id").to_numpy() & _ROW_MASK).astype(np.int64)
        cols = ["key", "minhash"] + ["text"] * f.exact_check + ["hash"] * f.has_hash
        t = read_block_columns(run.prepare_work, task.prepare, cols)
        t = t.take(pa.array(rows, pa.int64()))
        table = pa.table({"id": m.column("id"), "label": m.column("label"),
                          **{c: t.column(c) for c in cols}})
        label = m.column("label").to_numpy()
        write_partitioned(out.path(".arrow"), table, node_partition(label, run.parts),
                          run.parts)
        return {"members": len(m)}
    return cached(out, compute)


def _texts(col: pa.ChunkedArray, batch: int = 4096) -> Iterator[str]:
    for i in range(0, len(col), batch):
        yield from col.slice(i, batch).to_pylist()


def _verify(f: FuzzySettings, mem: pa.Table, edges: pa.Table
            ) -> tuple[np.ndarray, np.ndarray, dict[str, int], int]:
    """(twin, sim, counters, clusters) of the members ``mem`` (sorted by key)."""
    n = len(mem)
    label = mem.column("label").to_numpy()
    members = np.lexsort((np.arange(n), label)).astype(np.int64)
    lab = label[members]
    starts = np.flatnonzero(np.r_[True, lab[1:] != lab[:-1]]) if n else np.empty(0, int)
    bounds = np.r_[starts, n].astype(np.int64)
    ids = mem.column("id").to_numpy()
    sorter = np.argsort(ids)
    ends = np.stack([edges.column("head").to_numpy(), edges.column("member").to_numpy()], 1)
    local = sorter[np.searchsorted(ids, ends.ravel(), sorter=sorter)].reshape(-1, 2)
    sig = fixed_width(mem.column("minhash"), 4 * f.num_perm).view("<u4")
    if not f.exact_check:
        twin, sim = verify_estimate(sig, members, bounds, f.threshold)
        return twin, sim, {}, len(starts)
    values, offsets = candidate_shingle_sets(_texts(mem.column("text")), n, f.ngram)
    twin, sim, extra = verify_exact(sig, members, bounds, local.astype(np.int64),
                                    np.arange(n, dtype=np.int64), values, offsets,
                                    f.threshold, MAX_REPRESENTATIVES)
    return twin, sim, extra, len(starts)


def fuzzy_verify(task: PartitionTask) -> dict[str, Any]:
    """Per component partition: the exact check of every member against kept documents of
    its component (:func:`~tokenmill.pipeline.dedup.minhash.clusters.verify_exact`);
    removals ``(id, key, kept, jaccard)`` grouped by the join partition (content hash)."""
    f, run = task.fuzzy, task.fuzzy.run
    out = StageOutput(run.work, "fuzzy_verify", task.digest)

    def compute() -> dict[str, Any]:
        mem = read_partitions(_paths(run.work, "fuzzy_gather", task.inputs), task.p)
        mem = mem.take(pc.sort_indices(mem, sort_keys=[("key", "ascending")]))
        edges = read_partitions(_paths(run.work, "cc_final", task.cc, ".edges.arrow"), task.p)
        twin, sim, extra, clusters = _verify(f, mem, edges)
        dups = np.flatnonzero(twin >= 0)
        keys = mem.column("key")
        ids = mem.column("id").to_numpy()[dups]
        removed = pa.table({"id": pa.array(ids),
                            "key": keys.take(pa.array(dups, pa.int64())),
                            "kept": keys.take(pa.array(twin[dups], pa.int64())),
                            "jaccard": pa.array(sim[dups], pa.float64())})
        if f.has_hash:
            part = hash_partition(fixed_width(mem.column("hash"), 16)[dups], run.parts)
        else:
            part = node_partition(ids, run.parts)
        write_partitioned(out.path(".arrow"), removed, part, run.parts)
        per_kept = np.bincount(twin[dups], minlength=len(mem))
        sizes = Counter((per_kept[per_kept > 0] + 1).tolist())
        return {"removed": int(len(dups)),
                "kept_below_threshold": int(len(mem) - len(dups) - clusters), **extra,
                "cluster_sizes": {str(s): c for s, c in sorted(sizes.items())}}
    return cached(out, compute)


def join(task: PartitionTask) -> dict[str, Any]:
    """Per partition: this stage's removals, and (``task.earlier``) the earlier
    decision's removals of the same content hashes, re-pointed to the document this
    stage kept when their kept document was then removed; grouped by block."""
    f, run = task.fuzzy, task.fuzzy.run
    out = StageOutput(run.work, "join", task.digest)

    def compute() -> dict[str, Any]:
        cols: dict[str, list] = {c: [] for c in REMOVALS.names}
        fuzzy: dict[str, str] = {}
        if task.inputs:
            fz = read_partitions(_paths(run.work, "fuzzy_verify", task.inputs), task.p)
            ids = fz.column("id").to_numpy()
            fuzzy = dict(zip(fz.column("key").to_pylist(), fz.column("kept").to_pylist(),
                             strict=True))
            cols["block"] += (ids >> _ROW_BITS).tolist()
            cols["row"] += (ids & _ROW_MASK).tolist()
            cols["key"] += fz.column("key").to_pylist()
            cols["kept"] += fz.column("kept").to_pylist()
            cols["stage"] += [task.stage] * len(fz)
            cols["detail"] += [jaccard_detail(j, f.exact_check)
                               for j in fz.column("jaccard").to_pylist()]
        if task.earlier is not None:
            ex = read_partition(work_file(run.work, task.earlier))
            for c in ("block", "row", "key", "stage"):
                cols[c] += ex.column(c).to_pylist()
            for kept, detail in zip(ex.column("kept").to_pylist(),
                                    ex.column("detail").to_pylist(), strict=True):
                hit = fuzzy.get(kept)
                cols["kept"].append(kept if hit is None else hit)
                cols["detail"].append(detail if hit is None else f"same text as {kept}")
        table = pa.table(cols, schema=REMOVALS)
        write_partitioned(out.path(".arrow"), table, np.asarray(cols["block"], np.int64),
                          run.n_blocks)
        return {"removed": len(table)}
    return cached(out, compute)


class MinHashDedup(GlobalStage):
    """MinHash-LSH fuzzy dedup over the documents the earlier global stages kept (see
    the module docstring and :mod:`tokenmill.pipeline.dedup.minhash`): a document is
    removed only if its exact shingle Jaccard with a kept document of its cluster is at
    least ``threshold`` (the candidates' texts are read again from their blocks;
    ``exact_check=False``: the former estimate-only decision); the lowest key of a
    cluster is kept. An exact duplicate of a document this stage removed then points to
    the document actually kept."""

    name = "fuzzy_dedup"
    version = 1
    columns = ("minhash", "shingles")

    def __init__(self, threshold: float = 0.8, ngram: int = 5, num_perm: int = 128,
                 seed: int = 1, exact_check: bool = True) -> None:
        super().__init__(threshold=threshold, ngram=ngram, num_perm=num_perm, seed=seed,
                         exact_check=exact_check)

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``minhash``: binary(4 * num_perm) little-endian uint32 signature; ``shingles``:
        int64 shingle count (0 for a document shorter than one shingle)."""
        f = self.config
        sig, nsh = minhash_signatures([d.text for d in docs], num_perm=f["num_perm"],
                                      seed=f["seed"], ngram=f["ngram"],
                                      return_shingle_counts=True)
        sig = np.ascontiguousarray(sig, dtype="<u4").reshape(len(docs), f["num_perm"])
        # a document shorter than one shingle is never called a near-duplicate: after
        # shingle normalization '-1' and '1', or 'NULL' and 'null', would be "identical"
        nsh = np.where([len(d.text.split()) >= f["ngram"] for d in docs], nsh, 0)
        return {"minhash": pa.array([row.tobytes() for row in sig], pa.binary(4 * f["num_perm"])),
                "shingles": pa.array(np.asarray(nsh, dtype=np.int64), pa.int64())}

    def settings(self, ctx: GlobalContext) -> FuzzySettings:
        """The settings its tasks share for the decision ``ctx``."""
        f = self.config
        bands, rows = lsh_params(f["threshold"], f["num_perm"])
        repoint = ctx.earlier is not None and ctx.earlier.same_text_by_hash
        return FuzzySettings(Shuffle.of(ctx), f["num_perm"], bands, rows, f["threshold"],
                             f["ngram"], f["exact_check"], repoint)

    def record(self, f: FuzzySettings, counters: dict[str, int],
               sizes: Counter) -> dict[str, Any]:
        """The manifest record: ``params``, ``counters``, ``cluster_sizes`` (size -> clusters)."""
        c = self.config
        params = fuzzy_params(c["num_perm"], f.bands, f.rows, c["threshold"], c["ngram"],
                              c["seed"], exact_check=c["exact_check"],
                              max_representatives=MAX_REPRESENTATIVES)
        return {"params": params, "counters": counters,
                "cluster_sizes": {str(s): sizes[s] for s in sorted(sizes)}}

    def decide(self, ctx: GlobalContext) -> GlobalDecision:
        """The phases in order; the removals (the earlier ones re-pointed when they are
        exact dedup's) and the manifest record."""
        f = self.settings(ctx)
        earlier = f.run.earlier
        if not ctx.blocks:  # nothing removed: the record of no documents
            zero = ("documents", "empty", "candidate_pairs", "candidate_clusters", "removed",
                    "kept_below_threshold")
            zero += ("exact_checks", "estimate_false_removals") * f.exact_check
            return GlobalDecision(earlier, self.record(f, dict.fromkeys(zero, 0), Counter()))
        cc, counters = self._candidates(ctx, f)
        verifies, sizes = self._verify(ctx, f, cc, counters)
        joins = self._join(ctx, f, verifies)
        own = tuple(removal_file("join", d) for d in joins)
        removals = own if f.has_hash else earlier + own
        return GlobalDecision(removals, self.record(f, counters, sizes))

    def _candidates(self, ctx: GlobalContext, f: FuzzySettings
                    ) -> tuple[tuple[str, ...], dict[str, int]]:
        """Phases 1-3 (map, buckets, components): the components' digests and counters."""
        fp, parts, ex = self.fingerprint(), ctx.parts, content_hash(list(f.run.earlier))
        maps = [BlockTask(f, i, d, content_hash("fuzzy_map", VERSION, fp, parts, d, i, ex))
                for i, d in enumerate(ctx.blocks)]
        infos = run_batches(fuzzy_map, maps, "fuzzy dedup: bands", ctx.progress)
        counters = {"documents": sum(x["documents"] for x in infos),
                    "empty": sum(x["empty"] for x in infos)}
        digests = tuple(t.digest for t in maps)
        all_maps = content_hash(list(digests))
        buckets = [PartitionTask(f, p, content_hash("fuzzy_buckets", VERSION, p, all_maps),
                                 digests) for p in range(parts)]
        run_batches(fuzzy_buckets, buckets, "fuzzy dedup: buckets", ctx.progress)
        cc, info = components(f.run.work, parts, [t.digest for t in buckets],
                              len(ctx.blocks), ctx.progress)
        counters |= {k: info[k] for k in ("candidate_pairs", "candidate_clusters")}
        return tuple(cc), counters

    def _verify(self, ctx: GlobalContext, f: FuzzySettings, cc: tuple[str, ...],
                counters: dict[str, int]) -> tuple[tuple[str, ...], Counter]:
        """Phases 4-5 (gather, verify): the verify partitions' digests and the cluster
        sizes; adds the check's counters to ``counters``."""
        fp, parts, all_cc = self.fingerprint(), ctx.parts, content_hash(list(cc))
        gathers = [BlockTask(f, i, d, content_hash("fuzzy_gather", VERSION, fp, parts, d, i,
                                                   all_cc), cc)
                   for i, d in enumerate(ctx.blocks)]
        run_batches(fuzzy_gather, gathers, "fuzzy dedup: candidates", ctx.progress)
        digests = tuple(t.digest for t in gathers)
        all_gathers = content_hash(list(digests))
        verifies = [PartitionTask(f, q, content_hash("fuzzy_verify", VERSION, fp, q,
                                                     all_gathers), digests, cc)
                    for q in range(parts)]
        infos = run_batches(fuzzy_verify, verifies, "fuzzy dedup: clusters", ctx.progress)
        sizes: Counter = Counter()
        for x in infos:
            sizes.update({int(k): v for k, v in x["cluster_sizes"].items()})
        counters["removed"] = sum(x["removed"] for x in infos)
        counters["kept_below_threshold"] = sum(x["kept_below_threshold"] for x in infos)
        if f.exact_check:
            for k in ("exact_checks", "estimate_false_removals"):
                counters[k] = sum(x[k] for x in infos)
        return tuple(t.digest for t in verifies), sizes

    def _join(self, ctx: GlobalContext, f: FuzzySettings, verifies: tuple[str, ...]
              ) -> list[str]:
        """Phase 6: the join partitions' digests."""
        fp, all_v = self.fingerprint(), content_hash(list(verifies))
        earlier = f.run.earlier if f.has_hash else ()
        tasks = [PartitionTask(f, p, content_hash("join", VERSION, p,
                                                  earlier[p] if earlier else None, all_v, fp,
                                                  len(ctx.blocks)),
                               verifies, earlier=earlier[p] if earlier else None,
                               stage=self.name)
                 for p in range(ctx.parts)]
        run_batches(join, tasks, "dedup: join", ctx.progress)
        return [t.digest for t in tasks]
