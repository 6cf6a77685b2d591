"""The work a Ray task does for one unit of input (a file, or a group of small files).

Two content-addressed stages run per unit, then one writer per source:

1. :func:`prepare_unit`: read → per-document license gate → normalize; writes the
   documents (key, text, exact-dedup hash, metadata) and the rejected rows.
2. :func:`tokenize_unit`: drop the unit's exact duplicates (decided globally by the
   driver) → length filters → tokenize (EOT first) → train/val split by key hash.
3. :func:`write_source`: a source's tokenized units, in order, into shards + sidecars,
   and its quarantine file.

All three are plain functions of their arguments (the executor wraps them as Ray
tasks), so the output never depends on which worker ran them or in what order.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.atomic import atomic_open, sha256_file
from tokenmill.pipeline import quarantine
from tokenmill.pipeline.filters import LengthFilter
from tokenmill.pipeline.intermediate import StageOutput, content_hash
from tokenmill.pipeline.license import DocumentLicenseGate
from tokenmill.pipeline.normalize import Normalize
from tokenmill.pipeline.readers import read_file
from tokenmill.manifests.shards import write_shard
from tokenmill.pipeline.step import Document, Rejection
from tokenmill.pipeline.tokenize import tokenize_batch

# per-document columns carried from the prepared block to the shard sidecar
_META_COLUMNS = ("license", "language", "language_score")


def _write_parquet(path: Path, table: pa.Table) -> None:
    with atomic_open(path) as f:
        pq.write_table(table, f, compression="zstd")


def text_hash(text: str) -> bytes:
    """16-byte blake2b of the UTF-8 text: the exact-dedup key (collisions ~2^-64 at 2^32 docs)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def _unit_items(spec: dict[str, Any], skip: int) -> Iterator[Document | Rejection]:
    """The unit's rows in order, the first ``skip`` passed over."""
    root = Path(spec["root"])
    files = spec["files"]
    if len(files) == 1:
        yield from read_file(root, files[0], spec["source"], spec["text_field"],
                             spec["max_document_bytes"], spec["limit"], skip=skip)
        return
    # several files only for one-document-per-file formats: one row per file
    for rel in files[skip:]:
        yield from read_file(root, rel, spec["source"], spec["text_field"],
                             spec["max_document_bytes"], spec["limit"])


def block_digest(unit_digest: str, index: int) -> str:
    return content_hash(unit_digest, "block", index)


def prepare_unit(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Stage 1 for one unit, in blocks of ``block_documents`` rows.

    ``spec`` keys: work, digest, source, root, files, text_field, max_document_bytes,
    limit, document_license, deny_terms, block_documents.

    Each block is its own content-addressed output (digest = hash(unit digest, block
    index)), committed as soon as it is done; a rerun after a crash skips finished blocks
    (without parsing their rows) and redoes at most the block in flight.

    Returns, per block in order, ``{"digest", "info"}`` where info holds the counters.
    """
    _fault_injection_delay()
    n = spec["block_documents"]
    blocks: list[dict[str, Any]] = []
    index = 0
    while True:
        digest = block_digest(spec["digest"], index)
        out = StageOutput(spec["work"], "prepare", digest)
        done = out.load_done()
        if done is None:
            items = itertools.islice(_unit_items(spec, index * n), n + 1)
            done = {"info": _prepare_block(spec, out, items, n)}
            done["info"]["reused"] = False
            if out.problem:
                done["info"]["recovered"] = [out.problem]
        else:
            done["info"]["reused"] = True
        blocks.append({"digest": digest, "info": done["info"]})
        if done["info"]["last"]:
            return blocks
        index += 1


def _prepare_block(spec: dict[str, Any], out: StageOutput, items, n: int) -> dict[str, Any]:
    rejected: list[Rejection] = []
    read_reasons: Counter = Counter()
    n_read = 0
    last = True

    def read_all():
        nonlocal n_read, last
        for item in items:
            if n_read == n:  # a row beyond this block exists: not the last block
                last = False
                return
            n_read += 1
            if isinstance(item, Rejection):
                read_reasons[item.reason] += 1
                rejected.append(item)
            else:
                yield item

    gate = DocumentLicenseGate(spec["deny_terms"]) if spec["document_license"] else None
    norm = Normalize()
    filters = [LengthFilter(**spec["filters"])]
    if spec["apply_quality"] and spec["quality"]:
        from tokenmill.pipeline.quality import build_quality_filter

        filters += [build_quality_filter(name, **(kw or {}))
                    for name, kw in spec["quality"].items() if kw is not None]
    if spec["language"] is not None:
        from tokenmill.pipeline.langid import LanguageFilter

        lang = dict(spec["language"])
        if not spec["apply_quality"]:
            lang["languages"] = None  # label only
        filters.append(LanguageFilter(**lang))
    stages = [s for s in (gate, norm, *filters) if s is not None]
    stream = read_all()
    for st in stages:
        st.sink = rejected.append
        stream = st(stream)
    docs: list[Document] = list(stream)
    rejected.sort(key=lambda r: r.key)

    cols: dict[str, Any] = {
        "key": pa.array([d.key for d in docs], pa.string()),
        "text": pa.array([d.text for d in docs], pa.large_string()),
        "hash": pa.array([text_hash(d.text) for d in docs], pa.binary(16)),
    }
    if spec["document_license"]:
        cols["license"] = pa.array([d.metadata.get("license") for d in docs], pa.string())
    if spec["language"] is not None:
        cols["language"] = pa.array([d.metadata.get("language") for d in docs], pa.string())
        cols["language_score"] = pa.array([d.metadata.get("language_score") for d in docs],
                                          pa.float32())
    if spec["fuzzy"] is not None:
        from tokenmill.pipeline.minhash import minhash_signatures

        f = spec["fuzzy"]
        sig, nsh = minhash_signatures([d.text for d in docs], num_perm=f["num_perm"],
                                      seed=f["seed"], ngram=f["ngram"],
                                      return_shingle_counts=True)
        sig = np.ascontiguousarray(sig, dtype="<u4").reshape(len(docs), f["num_perm"])
        # a document shorter than one shingle is never called a near-duplicate: after
        # shingle normalization '-1' and '1', or 'NULL' and 'null', would be "identical"
        nsh = np.where([len(d.text.split()) >= f["ngram"] for d in docs], nsh, 0)
        cols["minhash"] = pa.array([row.tobytes() for row in sig], pa.binary(4 * f["num_perm"]))
        cols["shingles"] = pa.array(np.asarray(nsh, dtype=np.int64), pa.int64())
    out.dir.mkdir(parents=True, exist_ok=True)
    _write_parquet(out.path(".docs.parquet"), pa.table(cols))
    quarantine.write_quarantine(out.path(".quarantine.parquet"), quarantine.to_table(rejected))
    info = {
        "read": n_read,
        "docs": len(docs),
        "last": last,
        "read_rejected": dict(sorted(read_reasons.items())),
        "license_rejected": dict(sorted(gate.stats.rejected.items())) if gate else {},
        "license_accepted": dict(sorted(gate.accepted.items())) if gate else {},
        "normalize_rejected": dict(sorted(norm.stats.rejected.items())),
        "filtered": dict(sorted(sum((f.stats.rejected for f in filters), Counter()).items())),
        "stages": {st.name: st.stats.to_dict() for st in stages},
    }
    out.commit([".docs.parquet", ".quarantine.parquet"], info)
    return info


def _fault_injection_delay() -> None:
    """``TOKENMILL_TASK_DELAY_S``: seconds each task sleeps first. Only for fault-injection
    tests (killing a worker mid-task needs a task that lasts); never set in production."""
    delay = float(os.environ.get("TOKENMILL_TASK_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)


def read_dedup_keys(work: str, digest: str) -> tuple[list[str], list[bytes]]:
    """(keys, hashes) of a prepared block, in document order."""
    t = pq.read_table(StageOutput(work, "prepare", digest).path(".docs.parquet"),
                      columns=["key", "hash"])
    return t.column("key").to_pylist(), t.column("hash").to_pylist()


def read_signatures(work: str, digest: str, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint32[n, num_perm] MinHash signatures, int64[n] shingle counts) of a block."""
    t = pq.read_table(StageOutput(work, "prepare", digest).path(".docs.parquet"),
                      columns=["minhash", "shingles"])
    col = t.column("minhash").combine_chunks()
    raw = col.buffers()[1]
    sig = np.frombuffer(raw, dtype="<u4", count=len(col) * num_perm,
                        offset=col.offset * 4 * num_perm).reshape(len(col), num_perm)
    return sig, t.column("shingles").to_numpy()


def split_of(key: str, val_fraction: float) -> str:
    """Deterministic train/val assignment from the sha256 of the document key."""
    if val_fraction <= 0:
        return "train"
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "val" if h < val_fraction * 2**64 else "train"


def tokenize_unit(spec: dict[str, Any]) -> dict[str, Any]:
    """Stage 2 for one block: drop its duplicates (decided globally by the driver), then
    tokenize. ``spec`` keys: work, digest, prepare_digest, source, duplicates (key →
    [kept key, stage, detail]), tokenizer, val_fraction."""
    _fault_injection_delay()
    out = StageOutput(spec["work"], "tokenize", spec["digest"])
    done = out.load_done()
    if done is not None:
        return done["info"] | {"reused": True}
    prep = StageOutput(spec["work"], "prepare", spec["prepare_digest"])
    table = pq.read_table(prep.path(".docs.parquet"))
    dups: dict[str, list] = spec["duplicates"]
    meta_cols = [c for c in _META_COLUMNS if c in table.column_names]
    rejected: list[Rejection] = []
    keys = table.column("key").to_pylist()
    texts = table.column("text").to_pylist()
    metas = {c: table.column(c).to_pylist() for c in meta_cols}
    kept_idx = []
    removed: Counter = Counter()
    for i, k in enumerate(keys):
        if k in dups:
            twin, stage, detail = dups[k]
            removed[stage] += 1
            rejected.append(Rejection(key=k, source=spec["source"], stage=stage,
                                      reason=f"{stage}:duplicate", text=texts[i],
                                      duplicate_of=twin, detail=detail))
        else:
            kept_idx.append(i)
    tokens, lengths = tokenize_batch([texts[i] for i in kept_idx], spec["tokenizer"])
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    cols = {
        "key": pa.array([keys[i] for i in kept_idx], pa.string()),
        "split": pa.array([split_of(keys[i], spec["val_fraction"]) for i in kept_idx],
                          pa.string()),
        "tokens": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                                pa.array(tokens, pa.uint32())),
    }
    for c in meta_cols:
        cols[c] = pa.array([metas[c][i] for i in kept_idx], table.schema.field(c).type)
    _write_parquet(out.path(".tokens.parquet"), pa.table(cols))
    quarantine.write_quarantine(out.path(".quarantine.parquet"), quarantine.to_table(rejected))
    info = {
        "docs_in": len(keys),
        "exact_duplicates": removed["exact_dedup"],
        "near_duplicates": removed["fuzzy_dedup"],
        "kept": len(kept_idx),
        "tokens": int(lengths.sum()),
    }
    out.commit([".tokens.parquet", ".quarantine.parquet"], info)
    return info | {"reused": False, "recovered": [out.problem] if out.problem else []}


def write_source(spec: dict[str, Any]) -> dict[str, Any]:
    """Write one source's shards, sidecars and quarantine file.

    ``spec`` keys: work, output_dir, source, units (list of (prepare_digest,
    tokenize_digest) in order), tokens_per_shard, shard_version.
    Returns the shard entries (paths relative to output_dir) and quarantine entry.
    """
    out_dir = Path(spec["output_dir"])
    source = spec["source"]
    shard_dir = out_dir / "shards" / source
    shard_dir.mkdir(parents=True, exist_ok=True)
    limit = spec["tokens_per_shard"]
    shards: list[dict[str, Any]] = []
    buffers: dict[str, dict[str, list]] = {
        s: {"tokens": [], "keys": [], "lengths": [], "meta": []} for s in ("train", "val")}
    counters = {"train": 0, "val": 0}
    meta_names: list[str] | None = None
    meta_types: dict[str, pa.DataType] = {}

    def flush(split: str) -> None:
        b = buffers[split]
        if not b["keys"]:
            return
        tokens = np.concatenate(b["tokens"])
        lengths = np.asarray(b["lengths"], dtype=np.uint64)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.uint64)
        name = f"{source}_{split}_{counters[split]:06d}.bin"
        path = shard_dir / name
        extra = {m: pa.array([row[i] for row in b["meta"]], meta_types[m])
                 for i, m in enumerate(meta_names or [])}
        write_shard(path, tokens, spec["shard_version"], offsets, b["keys"], extra)
        from tokenmill.manifests.shards import sidecar_path

        shards.append({
            "path": path.relative_to(out_dir).as_posix(), "split": split,
            "version": spec["shard_version"], "tokens": int(tokens.size),
            "documents": len(b["keys"]), "sha256": sha256_file(path),
            "sidecar_sha256": sha256_file(sidecar_path(path)),
        })
        counters[split] += 1
        buffers[split] = {"tokens": [], "keys": [], "lengths": [], "meta": []}

    q_tables = []
    for prep_digest, tok_digest in spec["units"]:
        q_tables.append(quarantine.read_quarantine(
            StageOutput(spec["work"], "prepare", prep_digest).path(".quarantine.parquet")))
        tout = StageOutput(spec["work"], "tokenize", tok_digest)
        q_tables.append(quarantine.read_quarantine(tout.path(".quarantine.parquet")))
        table = pq.read_table(tout.path(".tokens.parquet"))
        names = [c for c in table.column_names if c in _META_COLUMNS]
        if meta_names is None:
            meta_names = names
            meta_types = {c: table.schema.field(c).type for c in names}
        col = table.column("tokens").combine_chunks()
        flat = col.values.to_numpy()
        offs = col.offsets.to_numpy()
        metas = [table.column(m).to_pylist() for m in meta_names]
        for i, (key, split) in enumerate(zip(table.column("key").to_pylist(),
                                             table.column("split").to_pylist(), strict=True)):
            n = int(offs[i + 1] - offs[i])
            b = buffers[split]
            if b["keys"] and sum(b["lengths"]) + n > limit:
                flush(split)
                b = buffers[split]
            b["tokens"].append(flat[offs[i] : offs[i + 1]])
            b["keys"].append(key)
            b["lengths"].append(n)
            b["meta"].append([m[i] for m in metas])
    flush("train")
    flush("val")
    # Remove shards of an earlier run of this source that the new set does not have.
    keep = {Path(s["path"]).name for s in shards}
    for p in shard_dir.iterdir():
        base = p.name.removesuffix(".docs.parquet").removesuffix(".bin") + ".bin"
        if base not in keep and (p.suffix == ".bin" or p.name.endswith(".docs.parquet")):
            os.unlink(p)
    qtable = pa.concat_tables(q_tables) if q_tables else quarantine.to_table([])
    qpath = out_dir / "quarantine" / f"{source}.parquet"
    qpath.parent.mkdir(parents=True, exist_ok=True)
    quarantine.write_quarantine(qpath, qtable)
    return {
        "shards": shards,
        "quarantine": {"path": qpath.relative_to(out_dir).as_posix(), "rows": qtable.num_rows,
                       "sha256": sha256_file(qpath)},
    }
