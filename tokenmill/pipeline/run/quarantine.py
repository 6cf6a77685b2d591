"""Quarantine: every removed document or unusable row, with its stage and reason.

Stored as parquet with columns ``key, source, stage, reason, text, raw, duplicate_of,
detail`` (``raw`` holds the bytes of rows that could not be decoded; ``duplicate_of``
the key of the document kept in a document's place, for duplicates).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.atomic import atomic_open
from tokenmill.pipeline.stage import Rejection

SCHEMA = pa.schema([
    ("key", pa.string()), ("source", pa.string()), ("stage", pa.string()),
    ("reason", pa.string()), ("text", pa.large_string()), ("raw", pa.large_binary()),
    ("duplicate_of", pa.string()), ("detail", pa.string()),
])


def _storable(r: Rejection) -> Rejection:
    """Text holding lone surrogates cannot be stored as UTF-8: keep it as raw bytes
    (``surrogatepass``) instead, so nothing is lost."""
    if r.text is not None:
        try:
            r.text.encode("utf-8")
        except UnicodeEncodeError:
            r.raw = r.text.encode("utf-8", "surrogatepass")
            r.text = None
    return r


def to_table(rows: Iterable[Rejection]) -> pa.Table:
    rows = [_storable(r) for r in rows]
    cols = {name: [getattr(r, name) for r in rows] for name in SCHEMA.names}
    return pa.table(cols, schema=SCHEMA)


def write_quarantine(path: str | os.PathLike, table: pa.Table) -> None:
    """Write a quarantine table atomically."""
    with atomic_open(path) as f:
        pq.write_table(table, f, compression="zstd")


def read_quarantine(path: str | os.PathLike) -> pa.Table:
    return pq.read_table(path)
