"""Token shards in the modded-nanogpt layout, plus a document sidecar.

A shard ``*.bin`` is a header of 256 little-endian int32 followed by the tokens:

=========  ======================================================================
header[0]  magic 20240520 (modded-nanogpt / llm.c)
header[1]  version: 1 = uint16 tokens (vocabularies up to 65,536 ids, as
           modded-nanogpt's FineWeb shards); 2 = uint32 tokens (tokenmill's own
           version for larger vocabularies such as cl100k_base and o200k_base;
           ids never wrap silently)
header[2]  number of tokens (int32, so at most 2**31 - 1 per shard)
=========  ======================================================================

Every document starts with the EOT token (modded-nanogpt's FineWeb convention, which
its BOS-aligned loader relies on). Beside each shard, ``*.docs.parquet`` holds one row
per document: ``offset`` (uint64, position of the document's EOT token in the shard),
``n_tokens`` (uint32, EOT included) and ``key`` (the document key, ``source/file#row``),
so that any document can be found again and decoded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.atomic import atomic_open

MAGIC = 20240520
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
VERSION_UINT16 = 1
VERSION_UINT32 = 2
_DTYPES = {VERSION_UINT16: np.uint16, VERSION_UINT32: np.uint32}


class ShardError(ValueError):
    """A shard file is malformed (bad magic, version, or length); the message names it."""


def version_for_vocab(n_vocab: int) -> int:
    """Shard version for a vocabulary of ``n_vocab`` ids: 1 (uint16) up to 65,536, else 2."""
    return VERSION_UINT16 if n_vocab <= 1 << 16 else VERSION_UINT32


def sidecar_path(bin_path: str | os.PathLike) -> Path:
    """``foo.bin`` → ``foo.docs.parquet``."""
    p = Path(bin_path)
    return p.with_name(p.name[: -len(".bin")] + ".docs.parquet")


def write_shard(
    path: str | os.PathLike,
    tokens: np.ndarray,
    version: int,
    doc_offsets: np.ndarray,
    doc_keys: list[str],
    extra_columns: dict[str, pa.Array] | None = None,
) -> None:
    """Write a shard and its sidecar atomically.

    Args:
        tokens: 1-D integer array of token ids (any int dtype); cast to the version's dtype
            after a range check.
        version: 1 (uint16) or 2 (uint32).
        doc_offsets: uint64[D], start of each document (its EOT token) in ``tokens``.
        doc_keys: D document keys.
        extra_columns: optional per-document sidecar columns (length D).

    Raises:
        ShardError: a token id does not fit the version's dtype, or more than 2**31-1 tokens.
    """
    dtype = _DTYPES[version]
    tokens = np.asarray(tokens)
    if tokens.size and int(tokens.max()) > np.iinfo(dtype).max:
        raise ShardError(f"{path}: token id {int(tokens.max())} does not fit version {version}")
    if tokens.size >= 2**31:
        raise ShardError(f"{path}: {tokens.size} tokens exceed the int32 header count")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, version, tokens.size
    with atomic_open(path) as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes())
    offsets = np.asarray(doc_offsets, dtype=np.uint64)
    n_tok = np.diff(np.append(offsets, np.uint64(tokens.size))).astype(np.uint32)
    cols = {
        "offset": pa.array(offsets, pa.uint64()),
        "n_tokens": pa.array(n_tok, pa.uint32()),
        "key": pa.array(doc_keys, pa.string()),
    }
    cols.update(extra_columns or {})
    table = pa.table(cols)
    with atomic_open(sidecar_path(path)) as f:
        pq.write_table(table, f, compression="zstd")


@dataclass(frozen=True)
class ShardHeader:
    version: int
    n_tokens: int

    @property
    def dtype(self) -> type:
        return _DTYPES[self.version]


def read_header(path: str | os.PathLike) -> ShardHeader:
    """Read and check a shard header against the file size.

    Raises:
        ShardError: naming the file, on bad magic, unknown version or a length mismatch
            (a truncated or padded file).
    """
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ShardError(f"{path}: not a token shard: its header starts with {header[0]}, "
                         f"a shard's with the magic number {MAGIC} (modded-nanogpt layout)")
    version = int(header[1])
    if version not in _DTYPES:
        raise ShardError(f"{path}: unsupported shard version {version}")
    n = int(header[2])
    expected = HEADER_BYTES + n * np.dtype(_DTYPES[version]).itemsize
    if size != expected:
        raise ShardError(f"{path}: header says {n} tokens ({expected} bytes), "
                         f"file has {size} bytes")
    return ShardHeader(version=version, n_tokens=n)


def read_tokens(path: str | os.PathLike, mmap: bool = True) -> np.ndarray:
    """Tokens of a shard as a 1-D uint16/uint32 array (memory-mapped by default)."""
    h = read_header(path)
    if mmap:
        return np.memmap(path, dtype=np.dtype(h.dtype).newbyteorder("<"), mode="r",
                         offset=HEADER_BYTES, shape=(h.n_tokens,))
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        return np.frombuffer(f.read(), dtype=np.dtype(h.dtype).newbyteorder("<"))


def read_sidecar(path: str | os.PathLike) -> pa.Table:
    """The document sidecar table of shard ``path`` (offset, n_tokens, key, ...)."""
    # one file: ParquetFile, not read_table (its dataset layer is slower to set up)
    p = sidecar_path(path)
    try:
        with pq.ParquetFile(p) as f:
            return f.read()
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise ValueError(f"{p}: unreadable document sidecar ({e})") from None


def iter_documents(path: str | os.PathLike):
    """Yield ``(key, tokens)`` per document of a shard, tokens including the leading EOT."""
    tokens = read_tokens(path)
    side = read_sidecar(path)
    offsets = side.column("offset").to_numpy()
    lengths = side.column("n_tokens").to_numpy()
    for key, off, n in zip(side.column("key").to_pylist(), offsets, lengths, strict=True):
        yield key, tokens[int(off) : int(off) + int(n)]
