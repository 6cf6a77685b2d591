"""Sources: resolve a datamix source to a folder of data files with a license.

A source is a folder laid out like a Hugging Face dataset repository (a ``README.md``
dataset card whose YAML front matter gives ``license``, data files below it), either
local or fetched from the Hub with ``huggingface_hub.snapshot_download`` at a pinned
revision (the resolved commit sha is recorded; a revision given as a 40-hex sha, in
either case, is a commit sha: read as lower case, as the Hub writes them, and it must be
the snapshot's). A Hub source may name a dataset ``config`` and ``split``: then only the
card is part of the snapshot, the data files of that config and split are resolved on the
Hub as ``datasets`` resolves them (the card's ``configs:`` YAML, else the file layout) and
fetched one by one (:mod:`tokenmill.pipeline.read.hub`); offline (``HF_HUB_OFFLINE``),
``datasets`` resolves them in the cached snapshot. Hub downloads honour the usual
``HF_HOME`` / ``HF_HUB_CACHE`` / ``HF_ENDPOINT`` settings.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenmill import storage
from tokenmill.cliargs import counted
from tokenmill.pipeline.config import DatamixConfig, SourceConfig
from tokenmill.pipeline.read.card import CardError, front_matter
from tokenmill.pipeline.read.hub import (
    HubConfigError,
    client_error,
    fetch_card,
    fetch_split_files,
    hub_offline,
)
from tokenmill.pipeline.read.license import LicenseError, check_source_licenses
from tokenmill.pipeline.read.links import SkippedLink, walk_files
from tokenmill.pipeline.read.readers import is_data_file, printable_name

_CARD = "README.md"
#: added to a missing folder's error when its path holds a wildcard: ``path`` names a
#: folder, and which of its files are read is ``allow_patterns``
_GLOB_HINT = ("; `path` is a folder, not a pattern: give the dataset's folder (the one with "
              "its README.md card) as `path` and the pattern, relative to it, as "
              "`allow_patterns` (path: c4-en-sample, allow_patterns: ['data/*.json.gz'])")
log = logging.getLogger(__name__)


def _allowed(files: list[str], src: SourceConfig) -> list[str]:
    """The ``files`` (relative to the source's folder) that a local or bucket source's
    ``allow_patterns`` keep (all without patterns)."""
    if not src.allow_patterns:
        return files
    import fnmatch

    return [f for f in files if any(fnmatch.fnmatch(f, p) for p in src.allow_patterns)]


def _patterns_note(src: SourceConfig) -> str:
    """Added to "no readable data files" when ``allow_patterns`` filtered the folder's."""
    if not src.allow_patterns or src.hub is not None:
        return ""
    return (f" matching allow_patterns {src.allow_patterns} (patterns relative to that "
            "folder; `*` also matches `/`)")


class SourceError(ValueError):
    """A source cannot be used (missing folder, no license, disallowed license...)."""


class MissingLicenseError(SourceError):
    """A source has no license, in its dataset card (``card``) or the datamix."""

    def __init__(self, message: str, card: Path) -> None:
        super().__init__(message)
        self.card = card


@dataclass
class ResolvedSource:
    name: str
    root: Path
    origin: str
    revision: str | None
    license: str
    per_document_license: bool
    files: list[str]  # posix paths relative to root, sorted
    skipped_files: list[str] = field(default_factory=list)
    config: SourceConfig | None = None
    skipped_links: list[SkippedLink] = field(default_factory=list)
    #: the source's folder URL when it is in an object store (``root`` then holds only its
    #: card, in this node's staging folder), and its files' sizes in bytes from the listing
    url: str | None = None
    sizes: dict[str, int] = field(default_factory=dict)


def read_card_license(folder: Path) -> str | None:
    """The ``license`` of a dataset card's YAML front matter, lowercased, or ``None``.

    Raises:
        SourceError: the card is over the limits of :mod:`tokenmill.pipeline.read.card` (size,
            aliases, depth) or its YAML does not parse (one line naming it).
    """
    card = folder / _CARD
    if not card.is_file():
        return None
    try:
        meta = front_matter(card) or {}
    except CardError as e:
        raise SourceError(str(e)) from None
    lic = meta.get("license")
    if isinstance(lic, list):
        lic = lic[0] if len(lic) == 1 else "+".join(map(str, lic))
    if lic is not None and not isinstance(lic, str | int | float):
        raise SourceError(f"{card}: license must be a name or a list of names, got a "
                          f"{type(lic).__name__}")
    return str(lic).strip().lower()[:200] if lic is not None else None


def list_files(root: str | Path) -> list[str]:
    """The data files of a source folder, relative to ``root``, in the order the pipeline
    reads them (links out of the folder left out, as a run leaves them out)."""
    return _list_files(Path(root))[0]


def _list_files(root: Path, allowed: tuple[Path, ...] = ()
                ) -> tuple[list[str], list[str], list[SkippedLink]]:
    """(data files, other files (printable, only reported), links not followed) of a
    source folder; a link is read only when it points to a file inside ``root`` or
    ``allowed`` (:mod:`tokenmill.pipeline.read.links`)."""
    files, skipped = [], []
    found, links = walk_files(root, allowed)
    for rel in found:
        if rel == _CARD or any(part.startswith(".") for part in Path(rel).parts):
            continue
        if is_data_file(rel):
            files.append(rel)  # as the file system gave it: the readers open it
        else:
            skipped.append(printable_name(rel))  # only reported: valid UTF-8
    links = [k for k in links if not any(p.startswith(".") for p in Path(k.rel).parts)]
    for k in links:
        log.warning("not read: %s is a link to %s (%s)", printable_name(root / k.rel),
                    printable_name(k.target), k.why)
    return files, skipped, links


_SHA = re.compile(r"[0-9a-f]{40}")


def _snapshot(src: SourceConfig) -> tuple[Path, str]:
    """Download (or find in the cache) the source's Hub snapshot (online, for a config or
    split, only its card); returns its folder and commit sha. A 40-hex revision is a commit
    sha in either case (lower-cased before the download and the comparison). Raises
    ``ValueError`` when the datamix pins a 40-hex sha and the snapshot is another commit."""
    from huggingface_hub import snapshot_download

    repo_id, _, revision = src.hub.partition("@")
    if _SHA.fullmatch(revision.lower()):
        revision = revision.lower()  # commit shas are lower case on the Hub and in its cache
    patterns = None
    if src.allow_patterns:
        patterns = [_CARD, *src.allow_patterns]
    if (src.config is not None or src.split is not None) and not hub_offline():
        folder = fetch_card(repo_id, revision or None)  # the config's files come after
    else:
        # offline said explicitly: some huggingface_hub versions list the Hub tree for a
        # commit-sha revision even when HF_HUB_OFFLINE is set
        folder = Path(snapshot_download(repo_id=repo_id, repo_type="dataset",
                                        revision=revision or None, allow_patterns=patterns,
                                        local_files_only=hub_offline()))
    commit = folder.name  # snapshot folders are named by the commit sha
    if _SHA.fullmatch(revision) and commit != revision:
        raise ValueError(f"pinned revision {revision} resolved to snapshot {commit}")
    return folder, commit


def _dataset_files(root: Path, src: SourceConfig) -> list[str]:
    """The data files of the source's dataset ``config`` and ``split`` in a Hub snapshot
    folder, as ``datasets`` resolves them (the card's ``configs:`` YAML, else the
    standard file layout), relative to ``root``, in ``datasets``' order.

    Raises:
        SourceError: an unknown config or split (naming the ones there are), or data
            files of a type tokenmill does not read.
    """
    import datasets

    split = src.split or "train"
    try:
        builder = datasets.load_dataset_builder(str(root), name=src.config)
    except (ValueError, OSError, datasets.exceptions.DatasetsError) as e:
        # an unknown or missing config (datasets names the available ones), a config
        # whose files match nothing, a snapshot without data files: one line, the usage
        # example datasets appends (naming the snapshot folder as a dataset) left out
        first = str(e).split("\nExample of usage", 1)[0]
        raise SourceError(f"source {src.name!r}: dataset {src.hub} config "
                          f"{src.config or 'default'!r}: {' '.join(first.split())}") from e
    files = builder.config.data_files or {}
    if split not in files:
        raise SourceError(f"source {src.name!r}: no split {split!r} in config "
                          f"{builder.config.name!r} of {src.hub} (splits: "
                          f"{', '.join(map(str, files)) or 'none'})")
    rels = [Path(os.path.relpath(f, root)).as_posix() for f in files[split]]
    bad = [r for r in rels if r.startswith("../") or not is_data_file(r)]
    if bad:
        raise SourceError(f"source {src.name!r}: data files of config "
                          f"{builder.config.name!r} split {split!r} not readable by "
                          f"tokenmill: {', '.join(printable_name(b) for b in bad[:3])}")
    return rels


def _hub_split_files(root: Path, src: SourceConfig, commit: str) -> list[str]:
    """The config's and split's files, fetched one by one into the snapshot folder ``root``
    (:mod:`tokenmill.pipeline.read.hub`); offline, those of the cached snapshot."""
    if hub_offline():
        return _dataset_files(root, src)
    try:
        return fetch_split_files(root, src, commit)
    except HubConfigError as e:
        raise SourceError(f"source {src.name!r}: {e}") from e


def _check_text_columns(root: Path | str, files: list[str], src: SourceConfig) -> None:
    """Every parquet file of the source holds its text column (read from the footers).

    Raises:
        SourceError: one line naming the first file without it and the columns it has.
    """
    import pyarrow.parquet as pq

    column = src.text_key
    for rel in files:
        if not rel.lower().endswith(".parquet"):
            continue
        try:
            if storage.is_url(root):
                fs, path = storage.split(storage.join(str(root), rel))
                with fs.open(path, "rb") as f:
                    names = pq.read_schema(f).names
            else:
                names = pq.read_schema(Path(root) / rel).names
        except Exception:  # noqa: BLE001 (a corrupt file is quarantined by its reader)
            continue
        if column not in names:
            shown = ", ".join(printable_name(n) for n in names[:20])
            more = f" and {len(names) - 20} more" if len(names) > 20 else ""
            raise SourceError(f"source {src.name!r}: {printable_name(rel)} has no column "
                              f"{column!r} (its columns: {shown}{more}); name the text "
                              "column with `text_column:` on the source")


def hub_origin(src: SourceConfig) -> str:
    """A Hub source's ``origin`` in the manifest: ``hub:org/name``, and for a dataset
    config/split ``hub:org/name?config=CONFIG&split=SPLIT`` (the revision is recorded
    beside it, as the commit sha)."""
    origin = f"hub:{src.hub.partition('@')[0]}"
    if src.config is not None or src.split is not None:
        origin += f"?config={src.config or 'default'}&split={src.split or 'train'}"
    return origin


def resolve_source(cfg: DatamixConfig, src: SourceConfig) -> ResolvedSource:
    """Locate a source's files and license. A local ``path`` is relative to the data root
    and may not leave it (``../``, or a link out of it), unless it is written as an
    absolute path; the manifest's ``origin`` records it as given.

    Raises:
        SourceError: naming the source (missing folder, a relative path out of the data
            root, no license, no data files, a card over its limits).
    """
    if src.hub is not None:
        try:
            root, revision = _snapshot(src)
        except Exception as e:
            raise SourceError(f"source {src.name!r}: could not fetch Hub dataset {src.hub} "
                              f"({client_error(e)})") from e
        origin = hub_origin(src)
    elif storage.is_url(src.path) or storage.is_url(cfg.data_root or ""):
        return _resolve_url_source(cfg, src)
    else:
        base = (Path(cfg.data_root) if cfg.data_root else Path.cwd()).resolve()
        root = (base / src.path).resolve()
        if not Path(src.path).is_absolute() and not root.is_relative_to(base):
            raise SourceError(f"source {src.name!r}: path {src.path!r} leads to {root}, "
                              f"outside the data root {base}; write a folder outside it as "
                              "an absolute path")
        if not root.is_dir():
            raise SourceError(f"source {src.name!r}: folder {root} does not exist"
                              + _GLOB_HINT * any(c in src.path for c in "*?["))
        revision = None
        origin = src.path
    card_license = read_card_license(root)  # read even when unused: within its limits
    license_ = (src.license or card_license or "").lower()
    if not license_:
        raise MissingLicenseError(f"source {src.name!r}: no license in {root / _CARD} and "
                                  "none set in the datamix file", card=root / _CARD)
    blobs = (root.parent.parent / "blobs",) if src.hub is not None else ()
    files, skipped, links = _list_files(root, blobs)  # a Hub snapshot links into its blobs
    if src.hub is not None and (src.config is not None or src.split is not None):
        files, skipped = _hub_split_files(root, src, revision), []
    elif src.hub is None:
        files = _allowed(files, src)
    if not files:
        raise SourceError(f"source {src.name!r}: no readable data files under {root}"
                          + _patterns_note(src))
    _check_text_columns(root, files, src)
    return ResolvedSource(
        name=src.name, root=root, origin=origin, revision=revision, license=license_,
        per_document_license=src.document_license is not None, files=files,
        skipped_files=skipped, config=src, skipped_links=links,
    )


def _resolve_url_source(cfg: DatamixConfig, src: SourceConfig) -> ResolvedSource:
    """A source folder in an object store (``path`` a URL, or relative to a URL data
    root): listed there, its card copied to this node's staging folder; the manifest's
    ``origin`` is its URL (without credentials).

    Raises:
        SourceError: one line naming the source and its URL (no bucket, access denied,
            no such folder, no license, no data files).
    """
    if storage.is_url(src.path):
        url = storage.normalize(src.path)
    elif ".." in Path(src.path).parts or Path(src.path).is_absolute():
        raise SourceError(f"source {src.name!r}: path {src.path!r} must stay inside the "
                          f"data root {storage.redact(cfg.data_root or '')}")
    else:
        url = storage.join(cfg.data_root or "", src.path)
    try:
        storage.check_bucket(url)
        listing = storage.list_tree(url)
    except storage.StorageError as e:
        raise SourceError(f"source {src.name!r}: {e}") from None
    if not listing:
        raise SourceError(f"source {src.name!r}: folder {storage.redact(url)} does not exist "
                          "or holds no files" + _GLOB_HINT * any(c in src.path for c in "*?["))
    root = storage.local_dir(url)
    root.mkdir(parents=True, exist_ok=True)
    (root / _CARD).unlink(missing_ok=True)  # never an earlier run's copy
    if _CARD in listing:
        try:
            storage.download(storage.join(url, _CARD), root / _CARD)
        except storage.StorageError as e:
            raise SourceError(f"source {src.name!r}: {e}") from None
    card_license = read_card_license(root)
    license_ = (src.license or card_license or "").lower()
    if not license_:
        raise MissingLicenseError(f"source {src.name!r}: no license in "
                                  f"{storage.redact(storage.join(url, _CARD))} and none set in "
                                  "the datamix file", card=Path(storage.redact(url)) / _CARD)
    rels = [r for r in listing if r != _CARD and not any(
        part.startswith(".") for part in r.split("/"))]
    files = [r for r in rels if is_data_file(r)]
    skipped = [printable_name(r) for r in rels if not is_data_file(r)]
    files = _allowed(files, src)
    if not files:
        raise SourceError(f"source {src.name!r}: no readable data files under "
                          f"{storage.redact(url)}" + _patterns_note(src))
    try:
        _check_text_columns(url, files, src)
    except storage.StorageError as e:
        raise SourceError(f"source {src.name!r}: {e}") from None
    return ResolvedSource(
        name=src.name, root=root, origin=storage.redact(url), revision=None,
        license=license_, per_document_license=src.document_license is not None,
        files=files, skipped_files=skipped, config=src, url=url,
        sizes={f: listing[f] for f in files})


class SourceLicenseError(SourceError, LicenseError):
    """Sources without a license or with one not allowed, all named in one line."""


def resolve_sources(cfg: DatamixConfig) -> list[ResolvedSource]:
    """:func:`resolve_source` for every source of ``cfg``, in order, with their licenses
    checked against the allow-list.

    Raises:
        SourceError: one error, one line, listing every source that cannot be used
            (missing folder, no data files...), so a user fixes them all in one go; a
            :class:`SourceLicenseError` (also a ``LicenseError``) when any of them is
            about licenses: every source without a license and every source whose
            license is not allowed, together (not one error per run).
    """
    resolved: list[ResolvedSource] = []
    missing: list[str] = []
    problems: list[str] = []
    for src in cfg.sources:
        try:
            resolved.append(resolve_source(cfg, src))
        except MissingLicenseError as e:
            missing.append(f"{src.name!r} (no license in {e.card})")
        except SourceError as e:
            problems.append(str(e))
    unusable = len(problems) + len(missing)
    license_problems = []
    if missing:
        license_problems.append(
            f"no license for {counted(len(missing), 'source')}: {', '.join(missing)}; set "
            "`license:` on the source in the datamix, or in the dataset card's front matter")
    try:
        check_source_licenses(cfg, resolved)
    except LicenseError as e:
        license_problems.append(str(e))
    if not problems and not license_problems:
        return resolved
    message = "; ".join(problems + license_problems)
    if problems:
        message = (f"{unusable} of {counted(len(cfg.sources), 'source')} cannot be used: "
                   f"{message}")
    raise (SourceLicenseError if license_problems else SourceError)(message)
