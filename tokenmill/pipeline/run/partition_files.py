"""Hash-partitioned intermediate files: what the global stages' map and reduce tasks
exchange (:mod:`tokenmill.pipeline.dedup.exact`, :mod:`tokenmill.pipeline.dedup.fuzzy`,
:mod:`tokenmill.pipeline.run.removals`).

A partitioned file is one Arrow IPC file whose rows are grouped by partition (stable:
inside a partition the rows keep their order), with the partition offsets in the schema
metadata. A reader memory-maps the file and slices its partition, so reading partition
``p`` of a file touches only that partition's pages: a map task writes one file with
``n_parts`` partitions and each reduce task reads its slice of every map file (the
shuffle of MapReduce, with the files on the shared ``work/`` folder).

Every file is written atomically (:mod:`tokenmill.atomic`) and recorded with its sha256
in a done record (:class:`~tokenmill.pipeline.run.intermediate.StageOutput`), so a task whose
output is complete and intact is skipped on a rerun.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.atomic import atomic_open
from tokenmill.pipeline.run.intermediate import StageOutput

_OFFSETS = b"tokenmill.partition_offsets"
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (Steele, Lea & Flood 2014) of uint64 ``x``, elementwise:
    a bijective 64-bit mix whose low bits pick partitions evenly."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def fixed_width(col: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """uint8[n, width] view of a ``binary(width)`` (fixed-size binary) column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0:
        return np.empty((0, width), np.uint8)
    raw = np.frombuffer(arr.buffers()[1], np.uint8, count=(arr.offset + len(arr)) * width)
    return raw[arr.offset * width:].reshape(len(arr), width)


def write_partitioned(path: Path, table: pa.Table, part: np.ndarray, n_parts: int) -> list[int]:
    """Write ``table`` to ``path`` (Arrow IPC file, atomically) with its rows grouped by
    ``part`` (int64[len(table)], values in ``[0, n_parts)``), stable inside a partition.

    Returns the ``n_parts + 1`` row offsets (also stored in the schema metadata)."""
    part = np.asarray(part, np.int64)
    order = np.argsort(part, kind="stable")
    offsets = np.searchsorted(part[order], np.arange(n_parts + 1)).tolist()
    table = table.take(pa.array(order, pa.int64())).combine_chunks()
    meta = dict(table.schema.metadata or {}) | {_OFFSETS: json.dumps(offsets).encode()}
    table = table.replace_schema_metadata(meta)
    with atomic_open(path) as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=max(1, len(table)))
    return offsets


def read_partition(path: Path, p: int | None = None) -> pa.Table:
    """Partition ``p`` of a file of :func:`write_partitioned` (the whole table when
    ``p`` is None), memory-mapped (zero-copy; only its pages are read).

    Raises:
        OSError / pyarrow.ArrowInvalid: the file is missing or not an Arrow IPC file.
    """
    source = pa.memory_map(str(path), "r")
    table = pa.ipc.open_file(source).read_all()
    if p is None:
        return table
    offsets = json.loads(table.schema.metadata[_OFFSETS])
    return table.slice(offsets[p], offsets[p + 1] - offsets[p])


def read_partitions(paths: list[Path], p: int | None) -> pa.Table:
    """Partition ``p`` of every file of ``paths`` (at least one), concatenated in order,
    copied out of the memory maps.

    Raises:
        ValueError: ``paths`` is empty."""
    if not paths:
        raise ValueError("read_partitions: no files")
    parts = [read_partition(q, p).replace_schema_metadata(None) for q in paths]
    return pa.concat_tables(parts).combine_chunks()


def cached(out: StageOutput, compute: Callable[[], dict[str, Any]],
           files: tuple[str, ...] = (".arrow",)) -> dict[str, Any]:
    """The done record's info of ``out`` when it is complete and intact, else
    ``compute()`` (which writes ``files``) committed; ``info["reused"]`` says which."""
    done = out.load_done()
    if done is not None:
        return done["info"] | {"reused": True}
    out.dir.mkdir(parents=True, exist_ok=True)
    info = compute()
    out.commit(list(files), info)
    return info | {"reused": False}
