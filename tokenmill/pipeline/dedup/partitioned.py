"""Exact and MinHash-LSH fuzzy dedup decided in hash partitions on Ray, with no
per-document state on the driver.

The decisions (tested against a single-process oracle with the tests) are computed as
map/reduce phases over files in
``work/dedup/<phase>/`` (Arrow IPC, :mod:`tokenmill.pipeline.dedup.partition_files`).
``P`` is the datamix's ``dedup.partitions``; a document's id is ``block index << 32 | row``.

Exact dedup (first occurrence in the global order, block then row, is kept):

1. ``exact_map`` (per block): ``(hash, block, row, key)`` partitioned by content hash.
2. ``exact`` (per partition): every row of its hash range from every block; per hash the
   smallest ``(block, row)`` is kept, the others are written as removals
   ``(block, row, key, kept key)``, grouped by block.

Fuzzy dedup (documents exact dedup kept; today's guarantees exactly):

3. ``fuzzy_map`` (per block): one row ``(band, band values, id, key)`` per LSH band of
   every document with at least one shingle, partitioned by a hash of (band, values).
4. ``fuzzy_buckets`` (per partition): rows sorted by (band, values, key); inside a bucket
   every member is linked to the bucket's lowest key: the candidate edges
   ``(head, member)`` of :func:`~tokenmill.pipeline.dedup.minhash.lsh.band_edges`.
5. components (:mod:`tokenmill.pipeline.dedup.components`, per partition, a few rounds): the
   unique candidate edges (``candidate_pairs``) and their connected components by
   alternating large-star / small-star rounds; members ``(id, component)`` grouped by
   block, edges grouped by the component's partition (``candidate_clusters``).
6. ``fuzzy_gather`` (per block): the members' key, signature, text (and content hash).
7. ``fuzzy_verify`` (per component partition): whole components, members in key order,
   :func:`~tokenmill.pipeline.dedup.minhash.clusters.verify_exact` (or ``verify_estimate``):
   a member is removed only if its exact shingle Jaccard with a kept document of its
   component reaches the threshold; the lowest key is kept. Components are independent,
   so this equals the single-process decision for any ``P``.

Then ``join`` (per content-hash partition): an exact duplicate of a document fuzzy dedup
removed is re-pointed to the document actually kept (detail ``same text as ...``), and
``removals`` (per block): the block's ``key, kept, stage, detail`` rows as one parquet
file, read by its tokenize task
(:func:`~tokenmill.pipeline.run.tokenize_task.tokenize_block`).

Memory. A map task holds one block. A reduce task (``exact``, ``fuzzy_buckets``,
``join``) holds its partition: about ``1/P`` of all rows of its phase (exact: ~70 bytes a
document; buckets: ``bands`` rows of ~90 bytes, ~1.1 KB a document at 12 bands), so
raising ``P`` bounds it.
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
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill.pipeline.dedup.components import components, node_partition
from tokenmill.pipeline.dedup.minhash import candidate_shingle_sets, fuzzy_params, jaccard_detail
from tokenmill.pipeline.dedup.minhash.clusters import (
    verify_estimate,
    verify_exact,
)
from tokenmill.pipeline.dedup.minhash.lsh import lsh_params
from tokenmill.pipeline.dedup.partition_files import (
    cached,
    fixed_width,
    mix64,
    read_partition,
    read_partitions,
    run_tasks,
    write_partitioned,
)
from tokenmill.pipeline.dedup.stages import ExactDedup, MinHashDedup, read_signatures
from tokenmill.pipeline.run.intermediate import StageOutput, content_hash, write_parquet
from tokenmill.pipeline.run.prepare_task import read_block_columns

#: part of every phase's content address: bump when a phase's output changes
VERSION = 1
_ROW_BITS = np.int64(32)
_ROW_MASK = np.int64(0xFFFFFFFF)
#: kept documents every member is compared with (the single-process default)
MAX_REPRESENTATIVES = 32


def _out(spec: dict[str, Any], phase: str, digest: str | None = None) -> StageOutput:
    return StageOutput(spec["work"], phase, digest or spec["digest"])


def _paths(spec: dict[str, Any], phase: str, digests: list[str],
           suffix: str = ".arrow") -> list[Path]:
    return [StageOutput(spec["work"], phase, d).path(suffix) for d in digests]


def hash_partition(hashes: np.ndarray, parts: int) -> np.ndarray:
    """int64 partition of each 16-byte content hash (uint8[n, 16]): its first 8 bytes as a
    little-endian integer, modulo ``parts``."""
    low = np.ascontiguousarray(hashes[:, :8]).view("<u8").ravel()
    return (low % np.uint64(parts)).astype(np.int64)


# ---------------------------------------------------------------------------------------
# exact dedup
# ---------------------------------------------------------------------------------------
def exact_map(spec: dict[str, Any]) -> dict[str, Any]:
    """Per block: ``(hash, block, row, key)`` partitioned by content hash."""
    out = _out(spec, "exact_map")

    def compute() -> dict[str, Any]:
        t = read_block_columns(spec["prepare_work"], spec["prepare"], ["key", "hash"])
        n = len(t)
        table = pa.table({"hash": t.column("hash"),
                          "block": pa.array(np.full(n, spec["block"], np.int32)),
                          "row": pa.array(np.arange(n, dtype=np.int32)),
                          "key": t.column("key")})
        part = hash_partition(fixed_width(t.column("hash"), 16), spec["parts"])
        write_partitioned(out.path(".arrow"), table, part, spec["parts"])
        return {"docs": n}
    return cached(out, compute)


def exact_reduce(spec: dict[str, Any]) -> dict[str, Any]:
    """Per hash partition: the first ``(block, row)`` of every hash is kept; the removals
    ``(block, row, key, kept)`` are written grouped by block."""
    out = _out(spec, "exact")

    def compute() -> dict[str, Any]:
        t = read_partitions(_paths(spec, "exact_map", spec["maps"]), spec["p"])
        h = fixed_width(t.column("hash"), 16)
        lo = np.ascontiguousarray(h[:, :8]).view("<u8").ravel()
        hi = np.ascontiguousarray(h[:, 8:]).view("<u8").ravel()
        blk = t.column("block").to_numpy()
        row = t.column("row").to_numpy()
        order = np.lexsort((row, blk, hi, lo))
        new = np.ones(len(order), bool)
        new[1:] = (lo[order][1:] != lo[order][:-1]) | (hi[order][1:] != hi[order][:-1])
        first = order[np.flatnonzero(new)][np.cumsum(new) - 1]
        dup, kept = order[~new], first[~new]
        keys = t.column("key")
        removed = pa.table({"block": pa.array(blk[dup]), "row": pa.array(row[dup]),
                            "key": keys.take(pa.array(dup, pa.int64())),
                            "kept": keys.take(pa.array(kept, pa.int64()))})
        write_partitioned(out.path(".arrow"), removed, blk[dup], spec["n_blocks"])
        return {"docs": len(t), "removed": int(len(dup))}
    return cached(out, compute)


# ---------------------------------------------------------------------------------------
# fuzzy dedup
# ---------------------------------------------------------------------------------------
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


def _exact_removed_rows(spec: dict[str, Any]) -> np.ndarray:
    """Rows of this block that exact dedup removed (int32)."""
    if not spec["exact"]:
        return np.empty(0, np.int32)
    t = read_partitions(_paths(spec, "exact", spec["exact"]), spec["block"])
    return t.column("row").to_numpy()


def fuzzy_map(spec: dict[str, Any]) -> dict[str, Any]:
    """Per block: a row per (LSH band, document with shingles) of the documents exact
    dedup kept, partitioned by (band, band values)."""
    out = _out(spec, "fuzzy_map")

    def compute() -> dict[str, Any]:
        t = read_block_columns(spec["prepare_work"], spec["prepare"],
                               ["key", "minhash", "shingles"])
        sig, nsh = read_signatures(t, spec["num_perm"])
        keep = np.ones(len(t), bool)
        keep[_exact_removed_rows(spec)] = False
        idx = np.flatnonzero(keep & (nsh > 0))
        bands, rows, parts = spec["bands"], spec["rows"], spec["parts"]
        band, values, part = _band_rows(sig[idx], bands, rows, parts)
        ids = (np.int64(spec["block"]) << _ROW_BITS) | idx.astype(np.int64)
        width = 4 * rows
        bucket = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), len(band), [None, pa.py_buffer(values.tobytes())])
        keys = t.column("key").take(pa.array(np.tile(idx, bands), pa.int64()))
        table = pa.table({"band": pa.array(band), "bucket": bucket,
                          "id": pa.array(np.tile(ids, bands)), "key": keys})
        write_partitioned(out.path(".arrow"), table, part, parts)
        return {"documents": int(keep.sum()), "empty": int((keep & (nsh == 0)).sum())}
    return cached(out, compute)


def fuzzy_buckets(spec: dict[str, Any]) -> dict[str, Any]:
    """Per bucket partition: candidate edges ``(head, member)``, every member of a bucket
    linked to the bucket's lowest key; written grouped by a hash of the member."""
    out = _out(spec, "fuzzy_buckets")

    def compute() -> dict[str, Any]:
        t = read_partitions(_paths(spec, "fuzzy_map", spec["maps"]), spec["p"])
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
        part = node_partition(edges[:, 1], spec["parts"])
        write_partitioned(out.path(".arrow"), table, part, spec["parts"])
        return {"edges": int(len(edges))}
    return cached(out, compute)


def fuzzy_gather(spec: dict[str, Any]) -> dict[str, Any]:
    """Per block: the candidate documents' key, signature, content hash and (with the
    exact check) text, grouped by component partition."""
    out = _out(spec, "fuzzy_gather")

    def compute() -> dict[str, Any]:
        m = read_partitions(_paths(spec, "cc_final", spec["cc"], ".members.arrow"),
                            spec["block"])
        rows = (m.column("id").to_numpy() & _ROW_MASK).astype(np.int64)
        cols = ["key", "minhash"] + ["text"] * spec["exact_check"] + ["hash"] * spec["has_hash"]
        t = read_block_columns(spec["prepare_work"], spec["prepare"], cols)
        t = t.take(pa.array(rows, pa.int64()))
        table = pa.table({"id": m.column("id"), "label": m.column("label"),
                          **{c: t.column(c) for c in cols}})
        label = m.column("label").to_numpy()
        write_partitioned(out.path(".arrow"), table, node_partition(label, spec["parts"]),
                          spec["parts"])
        return {"members": len(m)}
    return cached(out, compute)


def _texts(col: pa.ChunkedArray, batch: int = 4096) -> Iterator[str]:
    for i in range(0, len(col), batch):
        yield from col.slice(i, batch).to_pylist()


def _verify(spec: dict[str, Any], mem: pa.Table, edges: pa.Table
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
    sig = fixed_width(mem.column("minhash"), 4 * spec["num_perm"]).view("<u4")
    if not spec["exact_check"]:
        twin, sim = verify_estimate(sig, members, bounds, spec["threshold"])
        return twin, sim, {}, len(starts)
    values, offsets = candidate_shingle_sets(_texts(mem.column("text")), n, spec["ngram"])
    twin, sim, extra = verify_exact(sig, members, bounds, local.astype(np.int64),
                                    np.arange(n, dtype=np.int64), values, offsets,
                                    spec["threshold"], MAX_REPRESENTATIVES)
    return twin, sim, extra, len(starts)


def fuzzy_verify(spec: dict[str, Any]) -> dict[str, Any]:
    """Per component partition: the exact check of every member against kept documents of
    its component (:func:`~tokenmill.pipeline.dedup.minhash.clusters.verify_exact`); removals
    ``(id, key, kept, jaccard)`` grouped by the join partition (content hash)."""
    out = _out(spec, "fuzzy_verify")

    def compute() -> dict[str, Any]:
        mem = read_partitions(_paths(spec, "fuzzy_gather", spec["gathers"]), spec["q"])
        mem = mem.take(pc.sort_indices(mem, sort_keys=[("key", "ascending")]))
        edges = read_partitions(_paths(spec, "cc_final", spec["cc"], ".edges.arrow"),
                                spec["q"])
        twin, sim, extra, clusters = _verify(spec, mem, edges)
        dups = np.flatnonzero(twin >= 0)
        keys = mem.column("key")
        ids = mem.column("id").to_numpy()[dups]
        removed = pa.table({"id": pa.array(ids),
                            "key": keys.take(pa.array(dups, pa.int64())),
                            "kept": keys.take(pa.array(twin[dups], pa.int64())),
                            "jaccard": pa.array(sim[dups], pa.float64())})
        if spec["has_hash"]:
            part = hash_partition(fixed_width(mem.column("hash"), 16)[dups], spec["parts"])
        else:
            part = node_partition(ids, spec["parts"])
        write_partitioned(out.path(".arrow"), removed, part, spec["parts"])
        per_kept = np.bincount(twin[dups], minlength=len(mem))
        sizes = Counter((per_kept[per_kept > 0] + 1).tolist())
        return {"removed": int(len(dups)),
                "kept_below_threshold": int(len(mem) - len(dups) - clusters), **extra,
                "cluster_sizes": {str(s): c for s, c in sorted(sizes.items())}}
    return cached(out, compute)


# ---------------------------------------------------------------------------------------
# join, per-block removals
# ---------------------------------------------------------------------------------------
_REMOVALS = pa.schema([("block", pa.int32()), ("row", pa.int32()), ("key", pa.string()),
                       ("kept", pa.string()), ("stage", pa.string()),
                       ("detail", pa.string())])


def join(spec: dict[str, Any]) -> dict[str, Any]:
    """Per content-hash partition: exact removals (re-pointed to the document fuzzy dedup
    kept when their kept document was then removed) and fuzzy removals, grouped by block."""
    out = _out(spec, "join")

    def compute() -> dict[str, Any]:
        cols: dict[str, list] = {f.name: [] for f in _REMOVALS}
        fuzzy: dict[str, tuple[str, float]] = {}
        if spec["verifies"]:
            fz = read_partitions(_paths(spec, "fuzzy_verify", spec["verifies"]), spec["p"])
            ids = fz.column("id").to_numpy()
            for k, kept, j in zip(*(fz.column(c).to_pylist() for c in ("key", "kept", "jaccard")),
                                  strict=True):
                fuzzy[k] = (kept, j)
            cols["block"] += (ids >> _ROW_BITS).tolist()
            cols["row"] += (ids & _ROW_MASK).tolist()
            cols["key"] += fz.column("key").to_pylist()
            cols["kept"] += fz.column("kept").to_pylist()
            cols["stage"] += [MinHashDedup.name] * len(fz)
            cols["detail"] += [jaccard_detail(j, spec["exact_check"])
                               for j in fz.column("jaccard").to_pylist()]
        if spec["exact"]:
            ex = read_partition(StageOutput(spec["work"], "exact", spec["exact"]).path(".arrow"))
            for c in ("block", "row", "key"):
                cols[c] += ex.column(c).to_pylist()
            for kept in ex.column("kept").to_pylist():
                hit = fuzzy.get(kept)
                cols["kept"].append(kept if hit is None else hit[0])
                cols["detail"].append(None if hit is None else f"same text as {kept}")
            cols["stage"] += [ExactDedup.name] * len(ex)
        table = pa.table(cols, schema=_REMOVALS)
        write_partitioned(out.path(".arrow"), table, np.asarray(cols["block"], np.int64),
                          spec["n_blocks"])
        return {"removed": len(table)}
    return cached(out, compute)


def assemble(spec: dict[str, Any]) -> dict[str, Any]:
    """Per block: its removals ``key, kept, stage, detail`` (sorted by key) as parquet;
    info ``removed`` and ``content`` (a digest of the removals, for tokenize's address)."""
    out = _out(spec, "removals")

    def compute() -> dict[str, Any]:
        t = read_partitions(_paths(spec, "join", spec["joins"]), spec["block"])
        t = t.take(pc.sort_indices(t, sort_keys=[("key", "ascending")]))
        t = t.select(["key", "kept", "stage", "detail"])
        write_parquet(out.path(".parquet"), t)
        rows = [[r["key"], [r["kept"], r["stage"], r["detail"]]] for r in t.to_pylist()]
        return {"removed": len(t), "content": content_hash(rows)}
    return cached(out, compute, (".parquet",))


def load_removals(work: str, digest: str) -> dict[str, list]:
    """A block's removals: removed key -> [kept key, stage, detail or None]."""
    t = pq.read_table(StageOutput(work, "removals", digest).path(".parquet"))
    return {k: [kept, st, d] for k, kept, st, d in
            zip(*(t.column(c).to_pylist() for c in ("key", "kept", "stage", "detail")),
                strict=True)}


# ---------------------------------------------------------------------------------------
# the driver: phases in order, only digests and counters
# ---------------------------------------------------------------------------------------
def _digest_list(digests: list[str]) -> str:
    return content_hash(digests)


def _exact_phases(base: dict[str, Any], prepare: list[str], fp: str, progress: bool
                  ) -> list[str]:
    parts, n_blocks = base["parts"], len(prepare)
    specs = [base | {"prepare": d, "block": i,
                     "digest": content_hash("exact_map", VERSION, fp, parts, d, i)}
             for i, d in enumerate(prepare)]
    run_tasks(exact_map, specs, "exact dedup: map", progress)
    maps = [s["digest"] for s in specs]
    all_maps = _digest_list(maps)
    specs = [base | {"maps": maps, "p": p, "n_blocks": n_blocks,
                     "digest": content_hash("exact", VERSION, fp, parts, p, all_maps)}
             for p in range(parts)]
    run_tasks(exact_reduce, specs, "exact dedup: partitions", progress)
    return [s["digest"] for s in specs]


def _fuzzy_lsh(base: dict[str, Any], prepare: list[str], exact: list[str], fp: str,
               progress: bool) -> tuple[list[str], dict[str, int]]:
    """Phases 3-5 (map, buckets, components): the components' digests and counters."""
    parts, ex = base["parts"], _digest_list(exact)
    specs = [base | {"prepare": d, "block": i, "exact": exact,
                     "digest": content_hash("fuzzy_map", VERSION, fp, parts, d, i, ex)}
             for i, d in enumerate(prepare)]
    infos = run_tasks(fuzzy_map, specs, "fuzzy dedup: bands", progress)
    counters = {"documents": sum(x["documents"] for x in infos),
                "empty": sum(x["empty"] for x in infos)}
    maps = [s["digest"] for s in specs]
    all_maps = _digest_list(maps)
    specs = [base | {"maps": maps, "p": p,
                     "digest": content_hash("fuzzy_buckets", VERSION, p, all_maps)}
             for p in range(parts)]
    run_tasks(fuzzy_buckets, specs, "fuzzy dedup: buckets", progress)
    cc, info = components(base, [s["digest"] for s in specs], len(prepare), progress)
    counters |= {k: info[k] for k in ("candidate_pairs", "candidate_clusters")}
    return cc, counters


def _fuzzy_phases(base: dict[str, Any], prepare: list[str], exact: list[str],
                  stage: MinHashDedup, progress: bool) -> tuple[list[str], dict[str, Any]]:
    """Phases 3-7: the verify partitions' digests and the manifest record."""
    f, fp, parts = stage.config, stage.fingerprint(), base["parts"]
    bands, rows = lsh_params(f["threshold"], f["num_perm"])
    base = base | {"num_perm": f["num_perm"], "bands": bands, "rows": rows,
                   "threshold": f["threshold"], "ngram": f["ngram"],
                   "exact_check": f["exact_check"], "has_hash": bool(exact)}
    cc, counters = _fuzzy_lsh(base, prepare, exact, fp, progress)
    specs = [base | {"prepare": d, "block": i, "cc": cc,
                     "digest": content_hash("fuzzy_gather", VERSION, fp, parts, d, i,
                                            _digest_list(cc))}
             for i, d in enumerate(prepare)]
    run_tasks(fuzzy_gather, specs, "fuzzy dedup: candidates", progress)
    gathers = [s["digest"] for s in specs]
    all_gathers = _digest_list(gathers)
    specs = [base | {"gathers": gathers, "cc": cc, "q": q,
                     "digest": content_hash("fuzzy_verify", VERSION, fp, q, all_gathers)}
             for q in range(parts)]
    infos = run_tasks(fuzzy_verify, specs, "fuzzy dedup: clusters", progress)
    sizes: Counter = Counter()
    for x in infos:
        sizes.update({int(k): v for k, v in x["cluster_sizes"].items()})
    counters["removed"] = sum(x["removed"] for x in infos)
    counters["kept_below_threshold"] = sum(x["kept_below_threshold"] for x in infos)
    if f["exact_check"]:
        for k in ("exact_checks", "estimate_false_removals"):
            counters[k] = sum(x[k] for x in infos)
    params = fuzzy_params(f["num_perm"], bands, rows, f["threshold"], f["ngram"], f["seed"],
                          exact_check=f["exact_check"],
                          max_representatives=MAX_REPRESENTATIVES)
    record = {"params": params, "counters": counters,
              "cluster_sizes": {str(s): sizes[s] for s in sorted(sizes)}}
    return [s["digest"] for s in specs], record


def _empty_record(stage: MinHashDedup) -> dict[str, Any]:
    """The fuzzy stage's manifest record over no documents."""
    f = stage.config
    bands, rows = lsh_params(f["threshold"], f["num_perm"])
    counters = dict.fromkeys(("documents", "empty", "candidate_pairs", "candidate_clusters",
                              "removed", "kept_below_threshold"), 0)
    if f["exact_check"]:
        counters |= {"exact_checks": 0, "estimate_false_removals": 0}
    params = fuzzy_params(f["num_perm"], bands, rows, f["threshold"], f["ngram"], f["seed"],
                          exact_check=f["exact_check"],
                          max_representatives=MAX_REPRESENTATIVES)
    return {"params": params, "counters": counters, "cluster_sizes": {}}


def decide_partitioned(prepare_work: str, prepare: list[str],
                       global_stages: list[tuple[str, dict[str, Any]]], parts: int,
                       progress: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The global stages' decisions (exact dedup, then fuzzy dedup when configured) over
    the prepared blocks ``prepare`` (their digests under ``prepare_work``, in the global
    document order), in ``parts`` hash partitions on the running Ray.

    Returns ``(per block, records)``: per block ``{"removals": digest of its removals
    file (``<prepare_work>/dedup/removals/<digest>.parquet``, see :func:`load_removals`),
    "content": digest of the removals, "removed": count}``; records by stage name (the
    fuzzy stage's manifest record: ``params``, ``counters``, ``cluster_sizes``).

    Raises:
        ValueError: ``parts < 1`` or a global stage this module does not know.
    """
    if parts < 1:
        raise ValueError(f"dedup partitions must be >= 1, got {parts}")
    names = [n for n, _ in global_stages]
    unknown = set(names) - {ExactDedup.name, MinHashDedup.name}
    if unknown:
        raise ValueError(f"no partitioned decision for global stage(s) {sorted(unknown)}")
    kw = dict(global_stages)
    if not prepare:  # no block: nothing removed, the fuzzy record of no documents
        return [], ({MinHashDedup.name: _empty_record(MinHashDedup(**kw[MinHashDedup.name]))}
                    if MinHashDedup.name in kw else {})
    base = {"work": str(Path(prepare_work) / "dedup"), "prepare_work": prepare_work,
            "parts": parts}
    exact: list[str] = []
    if ExactDedup.name in kw:
        exact = _exact_phases(base, prepare, ExactDedup(**kw[ExactDedup.name]).fingerprint(),
                              progress)
    verifies: list[str] = []
    records: dict[str, Any] = {}
    fuzzy = MinHashDedup(**kw[MinHashDedup.name]) if MinHashDedup.name in kw else None
    if fuzzy is not None:
        verifies, records[MinHashDedup.name] = _fuzzy_phases(base, prepare, exact, fuzzy,
                                                             progress)
    return _removals(base, prepare, exact, verifies, fuzzy, progress), records


def _removals(base: dict[str, Any], prepare: list[str], exact: list[str],
              verifies: list[str], fuzzy: MinHashDedup | None,
              progress: bool) -> list[dict[str, Any]]:
    parts = base["parts"]
    fp = fuzzy.fingerprint() if fuzzy is not None else None
    check = bool(fuzzy.config["exact_check"]) if fuzzy is not None else False
    all_v = _digest_list(verifies)
    specs = [base | {"exact": exact[p] if exact else None, "verifies": verifies, "p": p,
                     "n_blocks": len(prepare), "exact_check": check,
                     "digest": content_hash("join", VERSION, p, exact[p] if exact else None,
                                            all_v, fp, len(prepare))}
             for p in range(parts)]
    run_tasks(join, specs, "dedup: join", progress)
    joins = [s["digest"] for s in specs]
    all_j = _digest_list(joins)
    specs = [base | {"joins": joins, "block": i,
                     "digest": content_hash("removals", VERSION, i, all_j)}
             for i in range(len(prepare))]
    infos = run_tasks(assemble, specs, "dedup: removals", progress)
    return [{"removals": s["digest"], "content": x["content"], "removed": x["removed"]}
            for s, x in zip(specs, infos, strict=True)]
