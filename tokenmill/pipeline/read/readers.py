"""Readers: data files → a stream of :class:`Document` or :class:`Rejection`.

Formats, chosen by file name (compression by the file's first bytes):

=============================================  ==========================================
``.jsonl`` ``.ndjson`` ``.json``, each also     JSON: the layout is detected by content,
compressed: ``.gz`` ``.zst`` ``.zstd``          not by suffix: JSON Lines (one value per
``.bz2`` ``.xz``                                line), a JSON array (pretty-printed or
                                                not), one record, or a dict of records
                                                ``{"id": {"text": ...}}``
``.parquet``                                    one row per document (``text_field``;
                                                ``string`` or UTF-8 ``binary``)
``.txt`` ``.rst`` ``.md`` (not README.md)       the whole file is one document
=============================================  ==========================================

Bytes are read raw and decoded per row, so one bad row never sinks its file: a row that
cannot be used is yielded as a :class:`Rejection` with its reason (``undecodable_bytes``,
``invalid_json`` (any exception of the JSON parser: syntax, nesting too deep, integers
too long), ``not_an_object``, ``missing_text``, ``null_text``, ``non_string_text:<type>``,
``too_large``) and its raw bytes or text. A file that fails as a whole (truncated or
corrupt archive, corrupt parquet, no text column) ends with one ``unreadable_file``
rejection naming the file and the row where reading stopped; the rows before it are kept.
Compressed streams are read to their end-of-stream marker (gzip, bz2, xz by the standard
library, zstd frames checked here), so a file cut short is never read as a shorter file.

A UTF-8 byte order mark at the start of a file is skipped in every format. Document keys
are ``source/relative/path#row`` with the row zero-padded to 9 digits; a file name that is
not valid UTF-8 is written with its undecodable bytes escaped (``\\xff``), so keys are
always valid UTF-8.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import json
import lzma
from collections.abc import Iterator
from pathlib import Path

from tokenmill.pipeline.stage import Document, Rejection

_COMPRESSIONS = ("", ".gz", ".zst", ".zstd", ".bz2", ".xz")
_JSON_SUFFIXES = tuple(b + c for b in (".jsonl", ".ndjson", ".json") for c in _COMPRESSIONS)
_WHOLE_FILE_SUFFIXES = (".txt", ".rst", ".md")
_SUFFIXES = _JSON_SUFFIXES + _WHOLE_FILE_SUFFIXES + (".parquet",)
_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20
# compressed bytes fed to zstd at once: zstd expands at most ~32,768x (a run-length block),
# so one call yields at most ~256 MiB, whatever the file holds
_ZSTD_INPUT = 8192
#: The most decompressed bytes of a file read as one JSON value (an array of records) are
#: this or a line's cap, whichever is more; past it the file is quarantined as too_large.
MAX_VALUE_BYTES = 1 << 28
_KEPT_BYTES = 1_000_000  # of a row too large to read, its first bytes go to quarantine


def is_data_file(rel: str) -> bool:
    """Whether tokenmill reads this file name as data."""
    return rel.lower().endswith(_SUFFIXES)


def is_whole_file(rel: str) -> bool:
    """One document per file (``.txt``/``.rst``/``.md``)?"""
    return rel.lower().endswith(_WHOLE_FILE_SUFFIXES)


def printable_name(name: str | Path) -> str:
    """A file name as valid UTF-8 on one line: bytes the file system gave that are not
    UTF-8 (held as surrogate escapes by Python) are written as ``\\xNN``, and control
    characters (a newline, a tab, C1 controls, line separators) as Python writes them in
    a string literal (``\\n``, ``\\x1b``, ``\\u2028``), so a name never splits or
    recolours a line of output."""
    text = str(name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.translate(_CONTROL_ESCAPES)


_CONTROL_ESCAPES = {c: repr(chr(c))[1:-1] for c in
                    [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}


def doc_key(source: str, rel: str, row: int) -> str:
    """``source/rel#row`` (row zero-padded to 9 digits), always valid UTF-8."""
    return f"{source}/{printable_name(rel)}#{row:09d}"


class _ZstdReader(io.RawIOBase):
    """A zstd stream (one or more frames) that raises ``EOFError`` when the input ends
    inside a frame: ``zstandard``'s stream reader returns a short read instead."""

    def __init__(self, f: io.BufferedIOBase) -> None:
        import zstandard

        self._f, self._new = f, zstandard.ZstdDecompressor().decompressobj
        self._d, self._in_frame, self._out = self._new(), False, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._out:
            chunk = self._f.read(_ZSTD_INPUT)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ends inside a frame (file truncated)")
                return 0
            self._out = self._feed(chunk)
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _feed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            self._in_frame = True
            out.append(self._d.decompress(chunk))
            if not self._d.eof:
                break
            chunk, self._d, self._in_frame = self._d.unused_data, self._new(), False
        return b"".join(out)

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_binary(path: Path) -> io.BufferedIOBase:
    """Open a data file for reading its decompressed bytes; the compression is recognised
    by its magic number (gzip, zstd, xz, bz2), so a misnamed archive is read too."""
    with open(path, "rb") as f:
        magic = f.read(10)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(path, "rb")
    if magic.startswith(b"\x28\xb5\x2f\xfd"):
        return io.BufferedReader(_ZstdReader(open(path, "rb")), _CHUNK)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(path, "rb")
    if magic[:3] == b"BZh" and magic[4:10] == b"\x31\x41\x59\x26\x53\x59":
        return bz2.open(path, "rb")
    if path.name.lower().endswith((".gz", ".zst", ".zstd", ".bz2", ".xz")) and magic:
        raise ValueError(f"not a {path.suffix} archive (first bytes {magic[:4]!r})")
    return open(path, "rb")


class _RowContext:
    def __init__(self, source: str, rel: str, text_field: str, max_bytes: int,
                 url_field: str | None = None):
        self.source, self.rel, self.field, self.max_bytes = source, rel, text_field, max_bytes
        self.url_path = url_field.split(".") if url_field else None
        self.name = printable_name(Path(rel).name)

    def reject(self, row: int, reason: str, raw: bytes | None = None,
               text: str | None = None, detail: str | None = None) -> Rejection:
        return Rejection(key=doc_key(self.source, self.rel, row), source=self.source,
                         stage="read", reason=reason, raw=raw, text=text, detail=detail)

    def from_value(self, row: int, value: object, raw: bytes | None = None
                   ) -> Document | Rejection:
        """A parsed row → Document, or Rejection carrying ``raw`` (the row's bytes)."""
        try:
            return self._from_value(row, value, raw)
        except Exception as e:  # e.g. a value json.dumps cannot write back: never fatal
            return self.reject(row, "invalid_json", raw=raw,
                               detail=f"{self.name} row {row}: {type(e).__name__}: {e}")

    def _from_value(self, row: int, value: object, raw: bytes | None) -> Document | Rejection:
        meta: dict = {}
        if isinstance(value, dict):
            if self.field not in value:
                return self.reject(row, "missing_text", text=_short_json(value),
                                   detail=f"no field {self.field!r}")
            text = value[self.field]
            if isinstance(value.get("attributes"), dict):
                meta["attributes"] = value["attributes"]
            if self.url_path is not None:
                url = _dotted(value, self.url_path)
                if isinstance(url, str) and url:
                    meta["url"] = url
        elif isinstance(value, str):
            text = value
        else:
            return self.reject(row, "not_an_object", text=_short_json(value))
        if text is None:
            return self.reject(row, "null_text", text=_short_json(value))
        if isinstance(text, bytes | bytearray):  # parquet/arrow binary columns: UTF-8
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as e:
                return self.reject(row, "undecodable_bytes", raw=bytes(text),
                                   detail=f"{self.name} row {row}: {e.reason} at byte "
                                          f"{e.start}")
        if not isinstance(text, str):
            return self.reject(row, f"non_string_text:{type(text).__name__}",
                               text=_short_json(value), raw=raw)
        if len(text) * 4 > self.max_bytes and len(text.encode("utf-8", "surrogatepass")) > \
                self.max_bytes:
            return self.reject(row, "too_large", text=text,
                               detail=f"over max_document_bytes={self.max_bytes}")
        return Document(key=doc_key(self.source, self.rel, row), source=self.source,
                        text=text, metadata=meta)


def _dotted(value: object, path: list[str]) -> object:
    """``value[a][b]...`` for the path ``a.b...``, or None where a step is missing."""
    for step in path:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def _short_json(value: object, limit: int = 10_000) -> str:
    def default(o: object) -> str:
        return o.hex() if isinstance(o, bytes | bytearray) else str(o)

    s = json.dumps(value, ensure_ascii=False, default=default)
    return s if len(s) <= limit else s[:limit] + "…"


def _parse_line(line: bytes, row: int, ctx: _RowContext) -> Document | Rejection:
    """One JSON Lines row. Any failure of the decoder or parser (bad UTF-8, bad syntax,
    nesting too deep for the parser, an integer over Python's digit limit) rejects only
    this row, keeping its raw bytes."""
    if len(line) > _line_cap(ctx.max_bytes):
        return ctx.reject(row, "too_large", raw=line[:_KEPT_BYTES],
                          detail=f"line of {len(line)} bytes")
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return ctx.reject(row, "undecodable_bytes", raw=line,
                          detail=f"{ctx.name} line {row + 1}: {e.reason} at byte {e.start}")
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        return ctx.reject(row, "invalid_json", raw=line,
                          detail=f"{ctx.name} line {row + 1}: {e.msg} at column {e.colno}")
    except Exception as e:  # RecursionError (deep nesting), ValueError (huge integer)...
        return ctx.reject(row, "invalid_json", raw=line,
                          detail=f"{ctx.name} line {row + 1}: {type(e).__name__}: "
                                 f"{str(e)[:200]}")
    return ctx.from_value(row, value, raw=line)


def _read_lines(path: Path, ctx: _RowContext, limit: int | None, skip: int) -> Iterator:
    n_docs = 0
    with _open_binary(path) as f:
        for row, (line, length) in enumerate(_bounded_lines(f, _line_cap(ctx.max_bytes))):
            if limit is not None and n_docs >= limit:
                return
            if length is not None:  # a line past the cap: its head kept, the rest skipped
                n_docs += 1
                if n_docs > skip:
                    yield ctx.reject(row, "too_large", raw=line[:_KEPT_BYTES],
                                     detail=f"{ctx.name} line {row + 1}: over {length:,} "
                                            f"bytes (cut at {_line_cap(ctx.max_bytes):,})")
                continue
            line = line.rstrip(b"\r\n")
            if row == 0 and line.startswith(_BOM):
                line = line[3:]  # a UTF-8 byte order mark is not part of the first row
            if not line.strip():
                continue  # blank lines are not rows
            n_docs += 1
            if n_docs <= skip:
                continue  # already done by an earlier run: not even parsed
            yield _parse_line(line, row, ctx)


def _line_cap(max_bytes: int) -> int:
    """The longest line read whole: a document's bytes, times 6 for JSON escapes."""
    return max_bytes * 6 + 1024


def _bounded_lines(f: io.BufferedIOBase, cap: int) -> Iterator[tuple[bytes, int | None]]:
    """The lines of ``f`` as ``(line, None)``; a line longer than ``cap`` bytes (a
    decompression bomb without newlines, say) as ``(its first cap bytes, bytes seen)``,
    the rest read in chunks and dropped, so memory stays within ``cap`` + one chunk."""
    while True:
        line = f.readline(cap + 1)
        if not line:
            return
        if len(line) <= cap or line.endswith(b"\n"):
            yield line, None
            continue
        seen = len(line)
        while True:
            rest = f.readline(_CHUNK)
            seen += len(rest)
            if not rest or rest.endswith(b"\n"):
                break
        yield line, seen


def _read_capped(f: io.BufferedIOBase, cap: int, what: str) -> bytes:
    """All of ``f``, at most ``cap`` bytes. Raises :class:`TooLarge` past the cap."""
    data = f.read(cap + 1)
    if len(data) > cap:
        raise TooLarge(f"{what}: over {cap:,} bytes once decompressed, read as one JSON "
                       "value (write it as JSON Lines to read it row by row)")
    return data


class TooLarge(ValueError):
    """A file expands past what tokenmill reads into memory at once."""


def _json_layout(path: Path, field: str) -> str:
    """``"lines"``, ``"array"`` or ``"value"`` (the whole file is one JSON value: a record
    or a dict of records), from the file's first non-blank lines, whatever its name.

    A first line that parses alone makes the file JSON Lines, unless it is the file's only
    line and holds an array or a dict of records; a first line opening a value that ends
    on a later line makes it an array (``[``) or one value (``{``)."""
    with _open_binary(path) as f:  # lines cut at _CHUNK: only their first bytes matter
        first = f.readline(_CHUNK)
        if first.startswith(_BOM):
            first = first[3:]
        while first and not first.strip():
            first = f.readline(_CHUNK)
        if first and not first.endswith(b"\n"):  # the first line goes on: one value
            head = first.lstrip()[:1]
            return "array" if head == b"[" else "value" if head == b"{" else "lines"
        second = f.readline(_CHUNK)
        while second and not second.strip():
            second = f.readline(_CHUNK)
    head = first.lstrip()[:1]
    try:
        value = json.loads(first)
    except Exception:
        return "array" if head == b"[" else "value" if head == b"{" else "lines"
    if second:
        return "lines"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict) and field not in value and _is_dict_of_records(value):
        return "value"
    return "lines"


def _is_dict_of_records(value: dict) -> bool:
    return bool(value) and all(isinstance(v, dict | str) for v in value.values())


class _NotOneValue(Exception):
    """The file is not one JSON value after all: read it as JSON Lines."""


def _decode_whole(raw: bytes, ctx: _RowContext) -> str | Rejection:
    """A whole file's bytes as text (a UTF-8 BOM skipped), or the rejection of row 0 with
    the bytes when they are not UTF-8."""
    if raw.startswith(_BOM):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return ctx.reject(0, "undecodable_bytes", raw=raw,
                          detail=f"{ctx.name}: {e.reason} at byte {e.start}")


def _read_json_value(path: Path, ctx: _RowContext, limit: int | None) -> Iterator:
    """A file holding one JSON value: a JSON array (one row per element, parsed element by
    element so a bad element ends the file with its row named), one record, or a dict of
    records (one row per value, in file order)."""
    with _open_binary(path) as f:
        s = _decode_whole(_read_capped(f, _value_cap(ctx.max_bytes), ctx.name), ctx)
    if not isinstance(s, str):
        yield s
        return
    start = len(s) - len(s.lstrip())
    if s[start:start + 1] == "[":
        yield from itertools.islice(_iter_array(s, start + 1, ctx), limit)
        return
    try:
        value = json.loads(s)
    except Exception as e:  # not one value: JSON Lines whose first row is bad, say
        raise _NotOneValue from e
    if isinstance(value, dict) and ctx.field not in value and _is_dict_of_records(value):
        items = list(value.values())
    else:
        items = [value]
    for row, item in enumerate(items[:limit] if limit is not None else items):
        yield ctx.from_value(row, item)


def _value_cap(max_bytes: int) -> int:
    """The most bytes of a file read as one JSON value (an array of many documents)."""
    return max(_line_cap(max_bytes), MAX_VALUE_BYTES)


def _iter_array(s: str, pos: int, ctx: _RowContext) -> Iterator:
    """Elements of the JSON array whose ``[`` ends before ``pos`` in ``s``."""
    dec = json.JSONDecoder()
    row = 0
    while True:
        while pos < len(s) and s[pos] in " \t\r\n":
            pos += 1
        if s[pos:pos + 1] == "]" and row == 0:
            return
        try:
            value, pos = dec.raw_decode(s, pos)
        except Exception as e:  # syntax, RecursionError, huge integers: the rest is lost
            raise ValueError(f"element {row}: {type(e).__name__}: {str(e)[:200]}") from e
        yield ctx.from_value(row, value)
        row += 1
        while pos < len(s) and s[pos] in " \t\r\n":
            pos += 1
        sep = s[pos:pos + 1]
        pos += 1
        if sep == "]":
            if s[pos:].strip():
                raise ValueError(f"data after the array's closing ']' at char {pos}")
            return
        if sep != ",":
            raise ValueError(f"expected ',' or ']' after element {row - 1} at char {pos - 1}")


def _read_parquet(path: Path, ctx: _RowContext, limit: int | None) -> Iterator:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if ctx.field not in names:
        raise ValueError(f"{ctx.name}: no column {ctx.field!r} (columns: {names})")
    cols = [ctx.field] + (["attributes"] if "attributes" in names else [])
    row = 0
    for batch in pf.iter_batches(columns=cols, batch_size=1024):
        for rec in batch.to_pylist():
            if limit is not None and row >= limit:
                return
            yield ctx.from_value(row, rec)
            row += 1


def _read_whole(path: Path, ctx: _RowContext) -> Iterator:
    size = path.stat().st_size
    if size > ctx.max_bytes:
        with open(path, "rb") as f:  # its head kept, never the whole file in memory
            head = f.read(_KEPT_BYTES)
        yield ctx.reject(0, "too_large", raw=head,
                         detail=f"{size} bytes over max_document_bytes={ctx.max_bytes}")
        return
    text = _decode_whole(path.read_bytes(), ctx)
    yield text if not isinstance(text, str) else ctx.from_value(0, text)


def read_file(
    root: Path, rel: str, source: str, text_field: str = "text",
    max_document_bytes: int = 10_000_000, limit: int | None = None, skip: int = 0,
    url_field: str | None = None,
) -> Iterator[Document | Rejection]:
    """Yield the documents (or rejected rows) of one data file, in file order.

    A file that cannot be read to its end (truncated or corrupt archive, corrupt parquet,
    no text column, anything else that fails for the file as a whole) ends with one
    ``unreadable_file`` rejection naming the file and the row where reading stopped; the
    rows before it are kept. No exception of reading escapes, so one bad file never
    sinks a run.

    ``skip`` rows are passed over first (JSON Lines does not even parse them), which is
    how a resumed run jumps over the blocks it already finished.
    """
    path = root / rel
    ctx = _RowContext(source, rel, text_field, max_document_bytes, url_field)
    rows = 0
    try:
        for item in _read_any(path, rel, ctx, limit, skip):
            rows += 1
            yield item
    except Exception as e:  # any failure of the file quarantines the file
        reason = "too_large" if isinstance(e, TooLarge) else "unreadable_file"
        yield ctx.reject(skip + rows, reason,
                         detail=f"{printable_name(path)}: stopped after {skip + rows} rows: "
                                f"{type(e).__name__}: {printable_name(str(e))[:500]}")


def _read_any(path: Path, rel: str, ctx: _RowContext, limit: int | None,
              skip: int) -> Iterator[Document | Rejection]:
    low = rel.lower()
    if low.endswith(_JSON_SUFFIXES):
        layout = _json_layout(path, ctx.field)
        if layout == "lines":
            yield from _read_lines(path, ctx, limit, skip)
        else:
            try:
                yield from itertools.islice(_read_json_value(path, ctx, limit), skip, None)
            except _NotOneValue:
                yield from _read_lines(path, ctx, limit, skip)
    elif low.endswith(".parquet"):
        yield from itertools.islice(_read_parquet(path, ctx, limit), skip, None)
    elif low.endswith(_WHOLE_FILE_SUFFIXES):
        if skip == 0:
            yield from _read_whole(path, ctx)
    else:
        raise ValueError(f"{printable_name(path)}: unsupported data file format")
