"""Local copies of objects that commands read from a bucket: one cache folder per node,
laid out as the URLs are, so that relative paths between objects stay true between their
copies.

``s3://bucket/runs/small/shards/c4/x.bin`` is copied to
``CACHE/s3/bucket/runs/small/shards/c4/x.bin`` (:func:`cache_path`), with ``CACHE`` =
:func:`cache_root`. A manifest read from a bucket is downloaded afresh each time
(:func:`fresh_copy`); the files it lists are downloaded once and kept while their sha256 is
the one the manifest records (:func:`verified_copy`: the cache is keyed by the expected
sha256, and a copy is checked before use, so a changed object is fetched again and a
corrupt one is refused naming its URL). Readers then memory-map the local copies as they do
any local file.

A training-mix manifest in a bucket names its shards relative to its own folder
(:func:`relative`); a shard in another bucket, or in a bucket when the manifest is local, by
its URL (:func:`locate` reads both).

The same cache holds what a curation driver hands its workers through an output folder
in a bucket (the decontamination index, a classifier model, block lists): committed once
by a record listing their sha256 (:func:`commit_files`), copied once per node
(:func:`folder_copy`).

A top-level helper: it imports nothing from tokenmill's packages.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from pathlib import Path

from tokenmill import storage
from tokenmill.atomic import atomic_open, atomic_write_bytes, sha256_file

_CHUNK = 1 << 20  # bytes per read while hashing a download


class ChecksumError(ValueError):
    """An object's sha256 is not the one its manifest records (one line naming its URL)."""


def cache_root() -> Path:
    """This node's cache of downloaded objects: ``TOKENMILL_CACHE_DIR``, else ``cache`` in
    the staging folder (:func:`tokenmill.storage.staging_root`)."""
    env = os.environ.get("TOKENMILL_CACHE_DIR")
    return Path(os.path.abspath(env)) if env else Path(os.path.abspath(storage.staging_root()
                                                                      / "cache"))


def _clean(url: str) -> tuple[str, str]:
    """``(scheme, path)`` of ``url`` with ``.`` and ``..`` resolved; ``ValueError`` for a
    path that climbs above its bucket."""
    scheme, _, rest = storage.normalize(url).partition("://")
    path = posixpath.normpath(rest) if rest else ""
    if not path or path.startswith(("..", "/")) or path == ".":
        raise ValueError(f"{storage.redact(url)}: not an object location (no bucket, or a "
                         "path above it)")
    return scheme.lower(), path


def cache_path(url: str) -> Path:
    """The local copy's path of the object or folder at ``url``."""
    scheme, path = _clean(url)
    return cache_root() / scheme / Path(*path.split("/"))


def cached_url(path: str | os.PathLike) -> str | None:
    """The URL whose copy ``path`` is (:func:`cache_path`'s inverse), ``None`` for a path
    outside the cache."""
    p, root = Path(os.path.abspath(path)), cache_root()
    for base, q in ((root, p), (root.resolve(), Path(path).resolve())):
        try:
            parts = q.relative_to(base).parts
        except ValueError:
            continue
        if len(parts) >= 2:
            return f"{parts[0]}://{'/'.join(parts[1:])}"
    return None


def remote(where: str | os.PathLike) -> str | None:
    """The URL ``where`` stands for: itself when a URL, the object a cached copy is of, or
    ``None`` for a local path."""
    return storage.normalize(where) if storage.is_url(where) else cached_url(where)


def shown(path: str | os.PathLike) -> str:
    """How messages name ``path``: the URL of a cached copy, else the path (redacted)."""
    return storage.redact(remote(path) or str(path))


def _bucket(url: str) -> tuple[str, str]:
    scheme, path = _clean(url)
    return scheme, path.split("/", 1)[0]


def relative(target: str | os.PathLike, root: str | os.PathLike) -> str:
    """How a manifest in the folder ``root`` names ``target`` (both local paths, cached
    copies or URLs): a relative posix path when both are local or in one bucket, else the
    target's URL (or absolute local path)."""
    t_url, r_url = remote(target), remote(root)
    if t_url is None and r_url is None:
        return Path(os.path.relpath(target, root)).as_posix()
    if t_url is not None and r_url is not None and _bucket(t_url) == _bucket(r_url):
        return posixpath.relpath(_clean(t_url)[1], _clean(r_url)[1])
    return storage.redact(t_url) if t_url is not None else str(Path(target).resolve())


def locate(root: str | os.PathLike, name: str) -> Path:
    """The local path of the file a manifest in ``root`` names ``name`` (a path relative
    to ``root``, an absolute path or a URL; a URL or a path in a cached folder gives the
    path of its cached copy)."""
    if storage.is_url(name):
        return cache_path(name)
    r_url = remote(root)
    if r_url is not None and not Path(name).is_absolute():
        return cache_path(f"{r_url}/{name}")
    return (Path(root) / name).resolve()


def fresh_copy(url: str) -> Path | None:
    """Download ``url`` to its cached copy afresh (a manifest: it may have been rewritten);
    ``None`` when there is no such object (and no stale copy is left).

    Raises:
        StorageError: the bucket is missing or cannot be read (one line naming ``url``).
    """
    local = cache_path(url)
    storage.check_bucket(url)
    if storage.fetch(storage.normalize(url), local):
        return local
    local.unlink(missing_ok=True)
    return None


def verified_copy(url: str, sha256: str | None) -> Path:
    """The local copy of ``url``, downloaded once: a copy already cached is kept when its
    sha256 is ``sha256`` (or, with ``sha256=None``, when it exists), else the object is
    downloaded again and its sha256 checked as it streams.

    Raises:
        ChecksumError: the object's sha256 differs from ``sha256`` (the copy is removed).
        FileNotFoundError: there is no such object (naming ``url``).
        StorageError: the bucket is missing or cannot be read (one line naming ``url``).
    """
    local = cache_path(url)
    if local.is_file() and (sha256 is None or sha256_file(local) == sha256):
        return local
    fs, path = storage.split(storage.normalize(url))
    digest = hashlib.sha256()

    def get() -> None:
        with fs.open(path, "rb") as src, atomic_open(local) as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)

    try:
        get()
    except FileNotFoundError:
        raise FileNotFoundError(f"{storage.redact(url)}: not found") from None
    except Exception as e:  # noqa: BLE001 (every client's error becomes one line)
        failure = storage.error(url, e, "read")
    else:
        if sha256 is None or digest.hexdigest() == sha256:
            return local
        local.unlink(missing_ok=True)
        raise ChecksumError(f"{storage.redact(url)}: sha256 {digest.hexdigest()[:16]}… differs "
                            f"from its manifest's ({sha256[:16]}…)")
    raise failure


# ---------------------------------------------------------------------------------------
# files the driver hands to every node: committed once in the store, copied per node
# ---------------------------------------------------------------------------------------
def _record_url(url: str) -> str:
    return f"{url.rstrip('/')}.done.json"


#: folders this process committed or found committed (a record is never taken back, and
#: the driver asks once per unit of work: one request each would add up)
_COMMITTED: set[str] = set()


def is_committed(url: str) -> bool:
    """Whether the folder ``url`` has the record of :func:`commit_files`."""
    if url not in _COMMITTED and storage.exists(_record_url(url)):
        _COMMITTED.add(url)
    return url in _COMMITTED


def commit_files(files: dict[str, str | os.PathLike], url: str) -> None:
    """Upload each local file of ``files`` (``{name: local path}``, names without ``/``)
    into the folder ``url``, then its record ``url + ".done.json"`` listing their sha256
    (written last: the folder is finished when the record is there). Nothing is uploaded
    when the record already exists (the folder's name says what it holds).

    Raises:
        StorageError: an object cannot be written (one line naming its URL).
    """
    if is_committed(url):
        return
    shas = {name: sha256_file(p) for name, p in sorted(files.items())}
    for name, p in sorted(files.items()):
        storage.upload(p, storage.join(url, name))
    storage.write_bytes(_record_url(url), json.dumps({"files": shas}, sort_keys=True).encode())
    _COMMITTED.add(url)


def folder_copy(url: str) -> Path:
    """This node's copy of the folder ``url`` committed by :func:`commit_files`: each file
    its record lists downloaded into the cache (:func:`verified_copy`, checked against the
    record's sha256), once per node (a ``.done.json`` written in the copy after them marks
    it whole).

    Raises:
        StorageError: the folder has no record (it was never committed) or cannot be
            read. ChecksumError: a file's bytes differ from its record's sha256.
    """
    local = cache_path(url)
    done = local / ".done.json"
    if done.is_file():
        return local
    try:
        blob = storage.read_bytes(_record_url(url))
    except storage.StorageError as e:
        raise storage.StorageError(f"{storage.redact(url)}: not committed ({e})") from None
    for name, sha in json.loads(blob)["files"].items():
        verified_copy(storage.join(url, name), sha)
    atomic_write_bytes(done, blob)
    return local


def node_file(where: str) -> str:
    """The local path of file ``where``: itself for a local path; for a URL (a file of a
    folder committed by :func:`commit_files`), this node's copy (:func:`folder_copy`)."""
    if not storage.is_url(where):
        return where
    folder, _, name = where.rstrip("/").rpartition("/")
    return str(folder_copy(folder) / name)
