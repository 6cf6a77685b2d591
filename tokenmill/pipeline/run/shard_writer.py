"""The shard-writing stage: one source's tokenized blocks, in order, into shards +
sidecars (:mod:`tokenmill.manifests.shards`), and its quarantine file.

It also settles the source's validation split: the tokenize stage put a document in
``val`` by the hash of its key (:func:`~tokenmill.pipeline.run.tokenize.split_of`); when that
gives fewer than the source's minimum (:func:`val_minimum`), the train documents next in
the same hash order move to ``val``, so that every source big enough has validation
documents, deterministically.

:func:`write_source_part` is a plain function of a :class:`WriteSourceTask` and a part:
``shards`` (:func:`write_source`: shards, sidecars, validation split) or ``quarantine``
(:func:`write_source_quarantine`: the source's quarantine file); the executor runs each
part of each source as its own Ray task, so that the two largest pieces of work of the
largest source run side by side.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill import storage
from tokenmill.atomic import sha256_file
from tokenmill.manifests.shards import sidecar_path, write_shard
from tokenmill.pipeline.run import quarantine
from tokenmill.pipeline.run.intermediate import StageOutput
from tokenmill.pipeline.run.tokenize import split_hash
from tokenmill.pipeline.stage import Configured


class WriteShards(Configured):
    """The shard-writing stage's settings (scope ``source``): shards of at most
    ``tokens_per_shard`` tokens per split, documents never cut, and the validation
    minimum's settings (:func:`val_minimum`). Its work is :func:`write_source`, a whole
    source at once."""

    name = "shards"
    version = 2

    def __init__(self, tokens_per_shard: int = 10_000_000, val_fraction: float = 0.01,
                 min_val_documents: int | None = None, default_min_val_documents: int = 1,
                 min_val_source_documents: int = 10) -> None:
        super().__init__(tokens_per_shard=tokens_per_shard, val_fraction=val_fraction,
                         min_val_documents=min_val_documents,
                         default_min_val_documents=default_min_val_documents,
                         min_val_source_documents=min_val_source_documents)
        self.tokens_per_shard = tokens_per_shard
        self.val_fraction = val_fraction
        self.min_val_documents = min_val_documents
        self.default_min_val_documents = default_min_val_documents
        self.min_val_source_documents = min_val_source_documents


def val_minimum(kept: int, val_fraction: float, min_val_documents: int | None,
                default_min_val_documents: int, min_val_source_documents: int) -> int:
    """The validation documents a source with ``kept`` documents gets at least.

    The source's own ``min_val_documents`` when set; else ``default_min_val_documents``
    for a source with at least ``min_val_source_documents`` kept documents and a
    ``val_fraction`` above 0 (``val_fraction: 0`` asks for no validation split). Never
    more than ``kept - 1``: at least one document stays in train.
    """
    if min_val_documents is not None:
        want = min_val_documents
    elif val_fraction > 0 and kept >= min_val_source_documents:
        want = default_min_val_documents
    else:
        want = 0
    return max(0, min(want, kept - 1))


@dataclass(frozen=True)
class WriteSourceTask:
    """One source's shard writing.

    Attributes:
        work: the ``work/`` folder of the blocks' outputs.
        output_dir: where ``shards/`` and ``quarantine/`` go (a local folder, or a URL:
            written in this node's staging folder, then uploaded).
        source: the source's name.
        units: ``(prepare digest, tokenize digest)`` of its blocks, in order.
        shards: the stage's settings.
        shard_version: the shard format version (by vocabulary size).
        meta_columns: the sidecar's metadata columns, among those the blocks hold.
    """

    work: str
    output_dir: str
    source: str
    units: tuple[tuple[str, str], ...]
    shards: WriteShards
    shard_version: int
    meta_columns: tuple[str, ...]


def _val_additions(spec: WriteSourceTask) -> tuple[set[str], dict[str, int]]:
    """The train documents of the source to move to ``val`` (keys), and the manifest's
    ``validation`` record (``min_documents``, ``by_fraction``, ``added``)."""
    train_keys: list[str] = []
    n_val = 0
    for _, tok_digest in spec.units:
        t = pq.read_table(StageOutput(spec.work, "tokenize", tok_digest)
                          .path(".tokens.parquet"), columns=["key", "split"])
        for key, split in zip(t.column("key").to_pylist(), t.column("split").to_pylist(),
                              strict=True):
            if split == "val":
                n_val += 1
            else:
                train_keys.append(key)
    sh = spec.shards
    minimum = val_minimum(n_val + len(train_keys), sh.val_fraction, sh.min_val_documents,
                          sh.default_min_val_documents, sh.min_val_source_documents)
    extra = heapq.nsmallest(max(0, minimum - n_val), train_keys,
                            key=lambda k: (split_hash(k), k))
    return set(extra), {"min_documents": minimum, "by_fraction": n_val, "added": len(extra)}


class _SplitWriter:
    """Buffers one split's documents and writes a shard whenever the next document would
    overflow ``limit`` tokens."""

    def __init__(self, spec: WriteSourceTask, split: str, out_dir: Path, shard_dir: Path,
                 meta_types: dict[str, pa.DataType], shards: list[dict[str, Any]]) -> None:
        self.spec, self.split, self.out_dir, self.shard_dir = spec, split, out_dir, shard_dir
        self.meta_types = meta_types
        self.shards = shards  # shared by both splits: entries in the order written
        self.count = 0
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.keys: list[str] = []
        self.lengths: list[int] = []
        self.meta: list[list] = []
        self.n_tokens = 0

    def add(self, tokens: np.ndarray, key: str, meta: list) -> None:
        if self.keys and self.n_tokens + tokens.size > self.spec.shards.tokens_per_shard:
            self.flush()
        self.tokens.append(tokens)
        self.keys.append(key)
        self.lengths.append(int(tokens.size))
        self.meta.append(meta)
        self.n_tokens += int(tokens.size)

    def flush(self) -> None:
        if not self.keys:
            return
        tokens = np.concatenate(self.tokens)
        lengths = np.asarray(self.lengths, dtype=np.uint64)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.uint64)
        path = self.shard_dir / f"{self.spec.source}_{self.split}_{self.count:06d}.bin"
        extra = {m: pa.array([row[i] for row in self.meta], t)
                 for i, (m, t) in enumerate(self.meta_types.items())}
        version = self.spec.shard_version
        write_shard(path, tokens, version, offsets, self.keys, extra)
        self.shards.append({
            "path": path.relative_to(self.out_dir).as_posix(), "split": self.split,
            "version": version, "tokens": int(tokens.size), "documents": len(self.keys),
            "sha256": sha256_file(path), "sidecar_sha256": sha256_file(sidecar_path(path)),
        })
        self.count += 1
        self._reset()


def _remove_stale_shards(shard_dir: Path, shards: list[dict[str, Any]]) -> None:
    """Remove shards of an earlier run of this source that the new set does not have."""
    keep = {Path(s["path"]).name for s in shards}
    for p in shard_dir.iterdir():
        base = p.name.removesuffix(".docs.parquet").removesuffix(".bin") + ".bin"
        if base not in keep and (p.suffix == ".bin" or p.name.endswith(".docs.parquet")):
            os.unlink(p)


def _upload(spec: WriteSourceTask, out_dir: Path, shards: list[dict[str, Any]]) -> None:
    """Upload the source's shards and sidecars, and delete the store's shards of this
    source that the new set does not have. Committed by the manifest the driver writes
    last, which lists every one with its sha256."""
    names = [s["path"] for s in shards]
    names += [sidecar_path(out_dir / n).relative_to(out_dir).as_posix() for n in names]
    storage.upload_tree(out_dir, spec.output_dir, names)
    remote = storage.join(spec.output_dir, "shards", spec.source)
    keep = {n.rsplit("/", 1)[-1] for n in names}
    for rel in storage.list_tree(remote):
        if rel not in keep:
            storage.remove(storage.join(remote, rel))


def write_source_part(job: tuple[WriteSourceTask, str]) -> dict[str, Any]:
    """``write_source(spec)`` for ``(spec, "shards")``, ``write_source_quarantine(spec)``
    for ``(spec, "quarantine")``.

    Raises:
        ValueError: another part name.
    """
    spec, part = job
    if part == "shards":
        return write_source(spec)
    if part == "quarantine":
        return write_source_quarantine(spec)
    raise ValueError(f"unknown part of a source's writing: {part!r}")


def write_source_quarantine(spec: WriteSourceTask) -> dict[str, Any]:
    """Write one source's quarantine file: its blocks' prepared and tokenize quarantine
    rows, block by block in order. Returns ``{"quarantine": {"path", "rows", "sha256"}}``
    (path relative to output_dir)."""
    out_dir = storage.local_dir(spec.output_dir)  # for a URL: this node's staging folder
    q_tables = []
    for prep_digest, tok_digest in spec.units:
        q_tables.append(quarantine.read_quarantine(
            StageOutput(spec.work, "prepare", prep_digest).path(".quarantine.parquet")))
        q_tables.append(quarantine.read_quarantine(
            StageOutput(spec.work, "tokenize", tok_digest).path(".quarantine.parquet")))
    qtable = pa.concat_tables(q_tables) if q_tables else quarantine.to_table([])
    qpath = out_dir / "quarantine" / f"{spec.source}.parquet"
    qpath.parent.mkdir(parents=True, exist_ok=True)
    quarantine.write_quarantine(qpath, qtable)
    rel = qpath.relative_to(out_dir).as_posix()
    if storage.is_url(spec.output_dir):
        storage.upload_tree(out_dir, spec.output_dir, [rel])
    return {"quarantine": {"path": rel, "rows": qtable.num_rows,
                           "sha256": sha256_file(qpath)}}


def write_source(spec: WriteSourceTask) -> dict[str, Any]:
    """Write one source's shards and sidecars (its quarantine file is
    :func:`write_source_quarantine`'s).

    Returns the shard entries (paths relative to output_dir) and the ``validation``
    record: ``{"shards", "validation"}``.
    """
    out_dir = storage.local_dir(spec.output_dir)  # for a URL: this node's staging folder
    shard_dir = out_dir / "shards" / spec.source
    shard_dir.mkdir(parents=True, exist_ok=True)
    to_val, validation = _val_additions(spec)
    writers: dict[str, _SplitWriter] | None = None
    shards: list[dict[str, Any]] = []
    for _, tok_digest in spec.units:
        table = pq.read_table(StageOutput(spec.work, "tokenize", tok_digest)
                              .path(".tokens.parquet"))
        if writers is None:  # the first block's metadata columns name the sidecar's
            types = {c: table.schema.field(c).type for c in table.column_names
                     if c in spec.meta_columns}
            writers = {s: _SplitWriter(spec, s, out_dir, shard_dir, types, shards)
                       for s in ("train", "val")}
        col = table.column("tokens").combine_chunks()
        flat, offs = col.values.to_numpy(), col.offsets.to_numpy()
        metas = [table.column(m).to_pylist() for m in writers["train"].meta_types]
        for i, (key, split) in enumerate(zip(table.column("key").to_pylist(),
                                             table.column("split").to_pylist(), strict=True)):
            split = "val" if key in to_val else split
            writers[split].add(flat[offs[i]:offs[i + 1]], key, [m[i] for m in metas])
    for w in (writers or {}).values():  # train, then val
        w.flush()
    _remove_stale_shards(shard_dir, shards)
    if storage.is_url(spec.output_dir):
        _upload(spec, out_dir, shards)
    return {"shards": shards, "validation": validation}
