"""Readers: data files → a stream of :class:`Document` or :class:`Rejection`.

Formats, chosen by file name:

=========================================  ==========================================
``.jsonl`` ``.ndjson`` ``.jsonl.gz``        one JSON object per line (``text_field``)
``.json.gz`` ``.jsonl.zst`` ``.json.zst``
``.parquet``                                one row per document (``text_field``)
``.json``                                   a JSON array: strings or objects, one each
``.txt`` ``.rst`` ``.md`` (not README.md)   the whole file is one document
=========================================  ==========================================

Bytes are read raw and decoded per row, so one bad row never sinks its file: a row that
cannot be used is yielded as a :class:`Rejection` with its reason (``undecodable_bytes``,
``invalid_json``, ``not_an_object``, ``missing_text``, ``null_text``,
``non_string_text:<type>``, ``too_large``) and its raw bytes or text. Document keys are
``source/relative/path#row`` with the row zero-padded to 9 digits.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from tokenmill.pipeline.step import Document, Rejection

_LINE_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz",
                  ".jsonl.zst", ".json.zst", ".jsonl.zstd")
_WHOLE_FILE_SUFFIXES = (".txt", ".rst", ".md")
_SUFFIXES = _LINE_SUFFIXES + _WHOLE_FILE_SUFFIXES + (".parquet", ".json")


def is_data_file(rel: str) -> bool:
    """Whether tokenmill reads this file name as data."""
    return rel.lower().endswith(_SUFFIXES)


def is_whole_file(rel: str) -> bool:
    """One document per file (``.txt``/``.rst``/``.md``)?"""
    return rel.lower().endswith(_WHOLE_FILE_SUFFIXES)


def doc_key(source: str, rel: str, row: int) -> str:
    return f"{source}/{rel}#{row:09d}"


def _open_binary(path: Path) -> io.BufferedIOBase:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith((".zst", ".zstd")):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
    return open(path, "rb")


class _RowContext:
    def __init__(self, source: str, rel: str, text_field: str, max_bytes: int):
        self.source, self.rel, self.field, self.max_bytes = source, rel, text_field, max_bytes

    def reject(self, row: int, reason: str, raw: bytes | None = None,
               text: str | None = None, detail: str | None = None) -> Rejection:
        return Rejection(key=doc_key(self.source, self.rel, row), source=self.source,
                         stage="read", reason=reason, raw=raw, text=text, detail=detail)

    def from_value(self, row: int, value: object) -> Document | Rejection:
        meta: dict = {}
        if isinstance(value, dict):
            if self.field not in value:
                return self.reject(row, "missing_text", text=_short_json(value),
                                   detail=f"no field {self.field!r}")
            text = value[self.field]
            if isinstance(value.get("attributes"), dict):
                meta["attributes"] = value["attributes"]
        elif isinstance(value, str):
            text = value
        else:
            return self.reject(row, "not_an_object", text=_short_json(value))
        if text is None:
            return self.reject(row, "null_text", text=_short_json(value))
        if not isinstance(text, str):
            return self.reject(row, f"non_string_text:{type(text).__name__}",
                               text=_short_json(value))
        if len(text) * 4 > self.max_bytes and len(text.encode("utf-8", "surrogatepass")) > \
                self.max_bytes:
            return self.reject(row, "too_large", text=text,
                               detail=f"over max_document_bytes={self.max_bytes}")
        return Document(key=doc_key(self.source, self.rel, row), source=self.source,
                        text=text, metadata=meta)


def _short_json(value: object, limit: int = 10_000) -> str:
    s = json.dumps(value, ensure_ascii=False, default=str)
    return s if len(s) <= limit else s[:limit] + "…"


def _read_lines(path: Path, ctx: _RowContext, limit: int | None, skip: int) -> Iterator:
    n_docs = 0
    with _open_binary(path) as f:
        for row, line in enumerate(f):
            if limit is not None and n_docs >= limit:
                return
            line = line.rstrip(b"\r\n")
            if row == 0 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]  # a UTF-8 byte order mark is not part of the first row
            if not line.strip():
                continue  # blank lines are not rows
            n_docs += 1
            if n_docs <= skip:
                continue  # already done by an earlier run: not even parsed
            if len(line) > ctx.max_bytes * 6 + 1024:  # JSON escapes can expand ~6x
                yield ctx.reject(row, "too_large", raw=line[:1_000_000],
                                 detail=f"line of {len(line)} bytes")
                continue
            try:
                s = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield ctx.reject(row, "undecodable_bytes", raw=line,
                                 detail=f"{path.name} line {row + 1}: {e.reason} at byte "
                                        f"{e.start}")
                continue
            try:
                value = json.loads(s)
            except json.JSONDecodeError as e:
                yield ctx.reject(row, "invalid_json", text=s[:1_000_000],
                                 detail=f"{path.name} line {row + 1}: {e.msg} at column "
                                        f"{e.colno}")
                continue
            yield ctx.from_value(row, value)


def _read_parquet(path: Path, ctx: _RowContext, limit: int | None) -> Iterator:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if ctx.field not in names:
        raise ValueError(f"{path}: no column {ctx.field!r} (columns: {names})")
    cols = [ctx.field] + (["attributes"] if "attributes" in names else [])
    row = 0
    for batch in pf.iter_batches(columns=cols, batch_size=1024):
        for rec in batch.to_pylist():
            if limit is not None and row >= limit:
                return
            yield ctx.from_value(row, rec)
            row += 1


def _read_json_array(path: Path, ctx: _RowContext, limit: int | None) -> Iterator:
    raw = path.read_bytes()
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        yield ctx.reject(0, "undecodable_bytes", raw=raw, detail=f"{path.name}: {e}")
        return
    except json.JSONDecodeError as e:
        yield ctx.reject(0, "invalid_json", raw=raw, detail=f"{path.name}: {e}")
        return
    items = value if isinstance(value, list) else [value]
    for row, item in enumerate(items[:limit] if limit is not None else items):
        yield ctx.from_value(row, item)


def _read_whole(path: Path, ctx: _RowContext) -> Iterator:
    size = path.stat().st_size
    if size > ctx.max_bytes:
        yield ctx.reject(0, "too_large", raw=path.read_bytes(),
                         detail=f"{size} bytes over max_document_bytes={ctx.max_bytes}")
        return
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        yield ctx.reject(0, "undecodable_bytes", raw=raw,
                         detail=f"{path.name}: {e.reason} at byte {e.start}")
        return
    yield ctx.from_value(0, text)


def read_file(
    root: Path, rel: str, source: str, text_field: str = "text",
    max_document_bytes: int = 10_000_000, limit: int | None = None, skip: int = 0,
) -> Iterator[Document | Rejection]:
    """Yield the documents (or rejected rows) of one data file, in file order.

    A file that cannot be read to its end (truncated archive, corrupt parquet, no text
    column) ends with one ``unreadable_file`` rejection naming the path and the row
    where reading stopped; the rows before it are kept.

    ``skip`` rows are passed over first (line formats do not even parse them), which is
    how a resumed run jumps over the blocks it already finished.

    """
    path = root / rel
    ctx = _RowContext(source, rel, text_field, max_document_bytes)
    rows = 0
    try:
        for item in _read_any(path, rel, ctx, limit, skip):
            rows += 1
            yield item
    except (OSError, EOFError, ValueError) as e:
        # a truncated archive, a corrupt parquet file, a missing column: the rest of the
        # file is quarantined as one row naming the file and where reading stopped
        yield ctx.reject(skip + rows, "unreadable_file",
                         detail=f"{path}: stopped after {skip + rows} rows: "
                                f"{type(e).__name__}: {e}")


def _read_any(path: Path, rel: str, ctx: _RowContext, limit: int | None,
              skip: int) -> Iterator[Document | Rejection]:
    low = rel.lower()
    if low.endswith(_LINE_SUFFIXES):
        yield from _read_lines(path, ctx, limit, skip)
    elif low.endswith(".parquet"):
        yield from itertools.islice(_read_parquet(path, ctx, limit), skip, None)
    elif low.endswith(".json"):
        yield from itertools.islice(_read_json_array(path, ctx, limit), skip, None)
    elif low.endswith(_WHOLE_FILE_SUFFIXES):
        if skip == 0:
            yield from _read_whole(path, ctx)
    else:
        raise ValueError(f"{path}: unsupported data file format")
