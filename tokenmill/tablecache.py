"""Lookup tables kept on disk, built once per machine instead of once per process.

Some kernels need tables that take a second of pure Python to build: a flag per Unicode
code point, the NFKC form of each, MinHash permutations from ``datasketch`` (whose import
pulls in scipy and pandas). Every Ray worker and every forked helper would build them
again, on every run. :func:`cached_arrays` builds them once and keeps them as an ``.npz``
file in ``__pycache__/tables/`` beside the package (where numba keeps its compiled
kernels), named by the sha256 of everything they depend on, so that a process loads them
in milliseconds:

    info, rep = cached_arrays("shingle-chars", ("v1", unicodedata.unidata_version),
                              build_tables)

The key must name every input of ``build`` (versions of Python's Unicode database, of a
library, the defining source); a changed input gives another file name, so a stale table
is never read. Files are written atomically, with a sha256 of the arrays' dtypes, shapes
and bytes, and read with ``allow_pickle=False``; a file that cannot be read, or whose
arrays do not match that digest, is built again and replaced, and a folder that cannot
be written (a read-only install) only costs the build, every time.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenmill.atomic import atomic_write_bytes

#: where the tables are kept (``TOKENMILL_TABLE_CACHE`` overrides it)
DEFAULT_DIR = Path(__file__).resolve().parent / "__pycache__" / "tables"


def table_dir() -> Path:
    """The folder of the cached tables."""
    return Path(os.environ.get("TOKENMILL_TABLE_CACHE") or DEFAULT_DIR)


def table_path(name: str, key: object) -> Path:
    """The file of table ``name`` for ``key`` (any JSON-serializable value)."""
    digest = hashlib.sha256(json.dumps([name, key], sort_keys=True).encode()).hexdigest()
    return table_dir() / f"{name}-{digest[:24]}.npz"


def cached_arrays(name: str, key: object,
                  build: Callable[[], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """``build()``, loaded from disk when a process on this machine built it before.

    Args:
        name: the table's name (a file name prefix).
        key: every input of ``build`` (JSON-serializable): versions, parameters, the
            sha256 of the defining source.
        build: returns the arrays (numeric dtypes only: no object arrays).

    Returns:
        The arrays, in ``build``'s order (loaded copies, writable).
    """
    path = table_path(name, key)
    loaded = _load(path)
    if loaded is not None:
        return loaded
    arrays = tuple(build())
    buf = io.BytesIO()
    np.savez(buf, digest=np.frombuffer(_digest(arrays), np.uint8),
             **{f"a{i}": a for i, a in enumerate(arrays)})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buf.getvalue())
    except OSError:
        pass  # a read-only install: built every time, as before
    return arrays


def _digest(arrays: tuple[np.ndarray, ...]) -> bytes:
    """sha256 over each array's dtype, shape and bytes."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def _load(path: Path) -> tuple[np.ndarray, ...] | None:
    """The arrays of ``path`` when it holds arrays whose digest matches (the dtypes,
    shapes and bytes that were written); None when it is absent, damaged or altered (a
    table read wrong would make a kernel compute wrong results, or read out of bounds)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            names = sorted((n for n in f.files if n != "digest"), key=lambda n: int(n[1:]))
            arrays = tuple(f[n] for n in names)
            stored = f["digest"].tobytes()
    except Exception:  # noqa: BLE001 - absent, or any damage (not a zip, a .npy, a huge
        return None    # header): built again
    return arrays if names and stored == _digest(arrays) else None


def source_sha256(*files: str | os.PathLike) -> str:
    """sha256 of the given source files' bytes (for a key: a table changes with them)."""
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).read_bytes())
    return h.hexdigest()
