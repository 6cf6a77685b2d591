"""The one verified way to open a manifest's shards.

Every consumer of shards (the trainer's loader, ``mix build``, ``shards export``,
``ngram build``, the legality check, ``manifest validate``) opens them with
:func:`open_shards`, which refuses, with one line naming the first offending file:

1. a manifest that is missing (a half-written output folder has shards but no
   ``manifest.json`` yet), is not JSON, is of the other kind (a curation manifest where a
   training-mix manifest is expected, or the reverse) or does not validate;
2. a listed shard or sidecar that is missing, or a shard whose header disagrees with the
   manifest's token count or with its own file size (a truncated shard);
3. unless ``verify=False``: a shard or sidecar whose sha256 differs from the manifest's
   (stale shards rewritten by a later run, or corrupt ones).

``verify=False`` skips only the hashing (step 3); it is an explicit opt-out that the
commands print.

A manifest may be a URL (``s3://``, ``gs://``, ``hf://``) or sit in a folder of one: it is
downloaded afresh, and the shards and sidecars it lists are downloaded once into this node's
cache (:mod:`tokenmill.objectcache`), each checked against the manifest's sha256 as it
arrives (a cached copy is reused while its sha256 matches), then read as local files.
Messages name the objects by their URL.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from tokenmill import objectcache, storage
from tokenmill.atomic import sha256_file
from tokenmill.manifests.mixschema import MixShard, TrainingMixManifest
from tokenmill.manifests.schema import (
    MANIFEST_NAME,
    DatamixManifest,
    ManifestError,
    ShardEntry,
    load_manifest_of,
)
from tokenmill.manifests.shards import ShardError, read_header, sidecar_path
from tokenmill.tokenizers.registry import check_installed

Kind = Literal["curation", "training-mix"]
_MAX_NAMED = 8  # differing files named in one error line
#: the manifest model of each kind, the curation one first (a file of neither kind is
#: refused as a curation manifest)
_MODELS: dict[Kind, type[DatamixManifest] | type[TrainingMixManifest]] = {
    "curation": DatamixManifest, "training-mix": TrainingMixManifest}


class ShardVerifyError(ValueError):
    """A manifest or one of its shards cannot be trusted; the one-line message names the
    first offending file (manifest, shard or sidecar) and what differs."""


@dataclass(frozen=True)
class VerifiedShard:
    """One shard listed by a manifest: its absolute path, the manifest's entry for it
    (``ShardEntry`` of a curation manifest, ``MixShard`` of a training-mix manifest) and
    the name of the source it belongs to."""

    path: Path
    entry: ShardEntry | MixShard
    source: str

    @property
    def sidecar(self) -> Path:
        """The document sidecar ``*.docs.parquet`` beside the shard."""
        return sidecar_path(self.path)


@dataclass(frozen=True)
class OpenedShards:
    """The result of :func:`open_shards`."""

    manifest: DatamixManifest | TrainingMixManifest
    manifest_path: Path
    root: Path
    shards: list[VerifiedShard]
    verified: bool

    def paths(self) -> list[Path]:
        """Absolute shard paths, in manifest order."""
        return [s.path for s in self.shards]


def manifest_file(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``path/manifest.json`` when ``path`` is a folder. For a URL (or
    a path in a cached copy of a bucket's folder): the manifest downloaded afresh into the
    cache (a ``.json`` URL is the file, any other the folder); the returned path does not
    exist when there is no such object.

    Raises:
        StorageError: the bucket is missing or cannot be read (one line naming the URL).
    """
    url = objectcache.remote(path)
    if url is None:
        p = Path(path)
        return p / MANIFEST_NAME if p.is_dir() else p
    if not url.endswith(".json"):
        url = storage.join(url, MANIFEST_NAME)
    return objectcache.fresh_copy(url) or objectcache.cache_path(url)


def read_manifest(path: str | os.PathLike, kind: Kind | None = "curation"
                  ) -> tuple[Path, DatamixManifest | TrainingMixManifest]:
    """Read a manifest of the expected ``kind`` (``None``: whichever kind the file is).

    Returns:
        (the manifest file's path, the validated model).

    Raises:
        ShardVerifyError: the file is missing (a half-written output folder), not JSON,
            of the other kind (named as such), of an unknown schema version, or invalid
            (the first wrong field by its path).
    """
    p = manifest_file(path)
    shown = objectcache.shown(p)
    if not p.is_file():
        folder = p.parent if p.name != Path(str(path)).name else None
        where = (f"{objectcache.shown(folder)} has no {p.name}" if folder is not None
                 else f"{shown}: not found")
        raise ShardVerifyError(f"{where}: no {kind or 'mix or curation'} manifest (an "
                               "unfinished or half-written output folder?)")
    models = tuple(_MODELS.values()) if kind is None else (_MODELS[kind],)
    try:  # read once, as the kind the file says it is when the caller takes either
        m = load_manifest_of(p, models)
        return p, cast(DatamixManifest | TrainingMixManifest, m)
    except ManifestError as e:
        raise ShardVerifyError(str(e).replace(str(p), shown)) from None


def listed_shards(m: DatamixManifest | TrainingMixManifest, root: Path,
                  split: str | None = None) -> list[VerifiedShard]:
    """The shards ``m`` lists for ``split`` (``None``: all), unchecked, with paths under
    ``root`` (the manifest's folder); a training-mix source's train shards, then its val
    shards."""
    out = []
    for src in m.sources:
        if isinstance(m, DatamixManifest):
            entries: list = list(src.shards)
        else:
            entries = list(src.shards) + list(src.val_shards)
        out += [VerifiedShard(path=objectcache.locate(root, e.path), entry=e,
                              source=src.name)
                for e in entries if split in (None, e.split)]
    return out


def _presence_problem(s: VerifiedShard, what: str) -> str | None:
    """One line if the shard or its sidecar is missing or the header disagrees."""
    if not s.path.is_file():
        return f"{objectcache.shown(s.path)}: missing (listed in {what})"
    if not s.sidecar.is_file():
        return f"{objectcache.shown(s.sidecar)}: missing document sidecar (listed in {what})"
    try:
        h = read_header(s.path)
    except ShardError as e:
        return f"{e} (listed in {what}; truncated or half-written?)"
    if h.n_tokens != s.entry.tokens or h.version != s.entry.version:
        return (f"{objectcache.shown(s.path)}: header has {h.n_tokens} tokens, version "
                f"{h.version}; {what} says {s.entry.tokens}, version {s.entry.version}")
    return None


def _files(shards: list[VerifiedShard]) -> list[tuple[Path, str]]:
    """(file, expected sha256) of every shard and sidecar, in order."""
    return [(p, want) for s in shards
            for p, want in ((s.path, s.entry.sha256), (s.sidecar, s.entry.sidecar_sha256))]


def fetch_remote(shards: list[VerifiedShard], *, verify: bool = True,
                 what: str = "the manifest") -> set[Path]:
    """Download the shards and sidecars that are cached copies of objects in a bucket
    (:func:`tokenmill.objectcache.verified_copy`: once, each checked against its
    manifest sha256 with ``verify``); a missing object is left for the presence check.

    Returns:
        the files whose sha256 was checked here (with ``verify``; else none).

    Raises:
        ShardVerifyError: an object's sha256 differs from the manifest's (names its URL).
        StorageError: a bucket is missing or cannot be read (one line naming the URL).
    """
    jobs = [(p, objectcache.cached_url(p), want) for p, want in _files(shards)]
    jobs = [j for j in jobs if j[1] is not None]

    def get(job: tuple[Path, str, str]) -> None:
        try:
            objectcache.verified_copy(job[1], job[2] if verify else None)
        except FileNotFoundError:
            job[0].unlink(missing_ok=True)
        except objectcache.ChecksumError as e:
            raise ShardVerifyError(f"{e} (listed in {what}); the object changed after the "
                                   "manifest was written") from None

    with ThreadPoolExecutor(max_workers=min(8, len(jobs) or 1)) as pool:
        list(pool.map(get, jobs))
    return {j[0] for j in jobs} if verify else set()


def _mismatches(shards: list[VerifiedShard], checked: frozenset[Path] = frozenset()
                ) -> list[tuple[Path, str, str]]:
    """(file, found sha256, expected) for every shard or sidecar that differs, in order
    (files in ``checked`` were hashed as they were downloaded)."""
    jobs = [(p, want) for p, want in _files(shards) if p not in checked]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(lambda j: sha256_file(j[0]), jobs))
    return [(p, got, want) for (p, want), got in zip(jobs, digests, strict=True) if got != want]


def _sha_line(p: Path, got: str, want: str, what: str) -> str:
    return (f"{objectcache.shown(p)}: sha256 {got[:16]}… differs from {what} ({want[:16]}…); "
            "the file changed after the manifest was written")


def shard_problems(shards: list[VerifiedShard], *, verify: bool = True,
                   what: str = "the manifest") -> list[str]:
    """Every problem of ``shards``, one line each (for reports such as ``manifest
    validate``): presence and header per shard, then (``verify``) the sha256 mismatches
    of the shards that are present, in manifest order."""
    try:
        checked = fetch_remote(shards, verify=verify, what=what)
    except ShardVerifyError as e:  # an object in a bucket that differs from its manifest
        return [str(e)]
    problems, present = [], []
    for s in shards:
        prob = _presence_problem(s, what)
        if prob:
            problems.append(prob)
        else:
            present.append(s)
    if verify:
        problems += [_sha_line(p, got, want, what)
                     for p, got, want in _mismatches(present, frozenset(checked))]
    return problems


def check_shards(shards: list[VerifiedShard], *, verify: bool = True,
                 what: str = "the manifest") -> None:
    """Check shards already listed (presence, header, and with ``verify`` sha256).

    Raises:
        ShardVerifyError: one line naming the first offending file; for sha256
            mismatches it also counts and names (up to 8) the other differing files.
    """
    checked = fetch_remote(shards, verify=verify, what=what)
    for s in shards:
        prob = _presence_problem(s, what)
        if prob:
            raise ShardVerifyError(prob)
    if not verify:
        return
    bad = _mismatches(shards, frozenset(checked))
    if not bad:
        return
    line = _sha_line(*bad[0], what)
    if len(bad) > 1:
        names = ", ".join(b[0].name for b in bad[1:_MAX_NAMED + 1])
        extra = ", …" if len(bad) > _MAX_NAMED + 1 else ""
        line += f"; {len(bad) - 1} more file(s) differ: {names}{extra}"
    raise ShardVerifyError(line)


def open_shards(path: str | os.PathLike, split: Literal["train", "val"] | None = "train", *,
                kind: Kind | None = "curation", verify: bool = True,
                log: Callable[[str], None] | None = None) -> OpenedShards:
    """Open a manifest's shards of ``split`` (``None``: both) after checking them.

    Args:
        path: a curation ``manifest.json`` or its folder, or a training-mix ``mix.json``.
        kind: the kind of manifest the caller expects (``None``: either, as the file says).
        verify: compare every shard's and sidecar's sha256 with the manifest (reads every
            byte); ``False`` skips only that (presence and headers are always checked).
        log: called with one line per check phase.

    Returns:
        :class:`OpenedShards`, shards in manifest order (sources in order). For a
        training-mix manifest, a source's train shards list only the ranges it grants.

    Raises:
        ShardVerifyError: see the module docstring; one line naming the first bad file.
        TokenizerMismatchError: the installed tokenizer of the manifest's tokenizer name
            is not the one it records (:func:`tokenmill.tokenizers.check_installed`).
    """
    if split not in ("train", "val", None):
        raise ValueError(f"split must be 'train', 'val' or None, not {split!r}")
    mpath, m = read_manifest(path, kind)
    check_installed(m.tokenizer, str(mpath))
    root = mpath.resolve().parent
    shards = listed_shards(m, root, split)
    if log:
        log(f"checking {len(shards)} shard(s) of {objectcache.shown(mpath)}"
            + ("" if verify else " (sha256 verification is off)"))
    check_shards(shards, verify=verify, what=objectcache.shown(mpath))
    return OpenedShards(manifest=m, manifest_path=mpath, root=root, shards=shards,
                        verified=verify)
