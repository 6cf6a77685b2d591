"""The training-mix manifest: the on-disk format ``tokenmill mix build`` writes.

JSON (sorted keys, no timestamps, paths relative to its own folder): same inputs, same
bytes. ``kind`` is ``"training-mix"`` (a curation manifest's is ``"curation"``). It lists,
per mix source, the curation shards with the document-aligned token ranges a trainer may
read, the effective weight schedule, and the sha256 of every curation manifest, shard and
sidecar it references. Planning lives in :mod:`tokenmill.manifests.mix`; reading shards
through it, verified, in :mod:`tokenmill.manifests.verify`.

Side channels (``tokenmill ngram lem`` / ``tokenmill ngram features``) made for a mix are
listed in its ``side_channels`` with the sha256 of their metadata file and of every array
file. A side channel binds to the mix by :func:`mix_identity_sha256`, the sha256 of the
manifest without its ``side_channels`` (the bytes ``mix build`` wrote), so listing one does
not invalidate the others. The key is absent when the list is empty, so a mix without side
channels keeps the bytes it always had.

A consumer opening a side channel the mix lists checks it against the listing first
(:func:`verify_listed_side_channel`): the metadata file's and every array file's sha256 and
the side channel's mix identity. :func:`register_side_channel` holds an exclusive
``fcntl.flock`` on a lock file beside the manifest (``.NAME.lock``) across its
read-modify-write, so concurrent registrations (the train and val runs of ``tokenmill ngram
lem``) never lose a listing.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenmill.atomic import atomic_write_text, sha256_bytes, sha256_file
from tokenmill.manifests.schema import load_manifest_as
from tokenmill.tokenizers import TokenizerIdentity

try:  # POSIX; elsewhere registrations are not serialized
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MIX_SCHEMA_VERSION = 1
MIX_KIND = "training-mix"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MixShard(_Model):
    path: str = Field(description="shard .bin path, relative to the training manifest folder")
    split: Literal["train", "val"] = Field(description="train or val")
    version: int = Field(description="shard version: 1 = uint16 tokens, 2 = uint32")
    tokens: int = Field(description="tokens in the whole shard")
    documents: int = Field(description="documents in the whole shard")
    sha256: str = Field(description="sha256 of the .bin file")
    sidecar_sha256: str = Field(description="sha256 of its .docs.parquet sidecar")
    start: int = Field(description="first token of the usable range (a document start)")
    end: int = Field(description="end (exclusive) of the usable range (a document end)")
    range_tokens: int = Field(description="end - start")
    range_documents: int = Field(description="documents in [start, end)")


class MixSource(_Model):
    name: str = Field(description="name in the mix spec")
    manifest: int = Field(description="index into curation_manifests")
    source: str = Field(description="source name in the curation manifest")
    weight: float = Field(description="requested share at token 0 (normalized)")
    requested_share: float = Field(description="requested tokens / requested total")
    max_epochs: float = Field(description="the spec's cap on passes over the source")
    available_tokens: int = Field(description="train tokens of the source (EOT included)")
    available_documents: int = Field(description="train documents of the source")
    requested_tokens: int = Field(description="tokens the spec's weights ask for over the run")
    epochs_needed: float = Field(description="requested_tokens / available_tokens")
    granted_tokens: int = Field(
        description="tokens the run reads from the source (at most available_tokens x max_epochs)")
    epochs: float = Field(description="granted_tokens / available_tokens (fractional)")
    effective_weight: float = Field(description="granted_tokens / total_tokens")
    shortfall_tokens: int = Field(description="requested_tokens - granted_tokens")
    shards: list[MixShard] = Field(description="train shards with the token ranges to use")
    val_shards: list[MixShard] = Field(description="val shards of the source, whole")


class MixSegment(_Model):
    start_token: int = Field(description="first token of this segment in the mixed stream")
    tokens: int = Field(description="tokens in this segment")
    weights: dict[str, float] = Field(description="effective weight per source (sums to 1)")


class CurationRef(_Model):
    name: str = Field(description="the curation manifest's datamix name")
    path: str = Field(description="relative to the training manifest folder")
    sha256: str = Field(description="sha256 of the manifest file")


class SideChannelFile(_Model):
    path: str = Field(description="relative to the training manifest folder")
    sha256: str = Field(description="sha256 of the file")


class SideChannelRef(_Model):
    kind: Literal["lem-side-channel", "ngram-side-channel"] = Field(
        description="lem-side-channel or ngram-side-channel")
    split: Literal["train", "val"] = Field(description="the split whose token stream it follows")
    path: str = Field(description="metadata file (lem.json / ngram.json), relative to the "
                      "training manifest folder")
    sha256: str = Field(description="sha256 of the metadata file")
    files: list[SideChannelFile] = Field(description="every array file with its sha256")


class TrainingMixManifest(_Model):
    """A training-mix manifest (``tokenmill mix build``): a mix spec planned over
    curation manifests."""

    schema_version: int = Field(
        default=MIX_SCHEMA_VERSION,
        description="version of this layout (a reader refuses another)")
    kind: Literal["training-mix"] = Field(default="training-mix", description="always training-mix")
    name: str = Field(description="the mix spec's name")
    spec: dict[str, Any] = Field(description="the mix spec as validated")
    spec_sha256: str = Field(description="sha256 of spec as JSON with sorted keys and the "
                             "separators \", \" and \": \"")
    seed: int = Field(description="the spec's seed (document order, row shuffle)")
    target_tokens: int = Field(description="the spec's token budget")
    total_tokens: int = Field(
        description="tokens granted over all sources (below target_tokens after a shortfall with "
        "shrink)")
    tokenizer: TokenizerIdentity = Field(
        description="the tokenizer of every shard (the same in every curation manifest)")
    curation_manifests: list[CurationRef] = Field(
        description="the curation manifests the sources come from")
    sources: list[MixSource] = Field(description="per mix source, in spec order")
    segments: list[MixSegment] = Field(
        description="the schedule's segments with their effective weights (one when there is no "
        "schedule)")
    warnings: list[str] = Field(description="shortfalls and other outcomes to read, one line each")
    side_channels: list[SideChannelRef] = Field(
        default_factory=list,
        description="side channels made for this mix (tokenmill ngram lem / features); absent "
        "from the file when empty")

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        if not data["side_channels"]:
            del data["side_channels"]  # no key at all: the file is the mix's identity
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        atomic_write_text(path, self.to_json())
        return path


def load_mix_manifest(path: str | os.PathLike) -> TrainingMixManifest:
    """Read a training-mix manifest (``tokenmill mix build``'s ``mix.json``).

    Raises:
        FileNotFoundError: no such file.
        ManifestError: (a ``ValueError``; one line naming the file) not JSON, a manifest
            of another kind (a curation manifest is named as such), another schema version,
            or invalid (each wrong field by its path with what was expected).
    """
    return load_manifest_as(path, TrainingMixManifest)


def mix_identity_sha256(path: str | os.PathLike) -> str:
    """sha256 of a training-mix manifest without its ``side_channels`` (module docstring):
    the identity a side channel binds to. Equal to the file's sha256 while none is listed.

    Raises:
        as :func:`load_mix_manifest`.
    """
    m = load_mix_manifest(path)
    return sha256_bytes(m.model_copy(update={"side_channels": []}).to_json().encode())


@contextlib.contextmanager
def _manifest_lock(mix_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.NAME.lock`` beside the manifest (module docstring).
    The lock file is left in place: removing it would let a waiting process lock a file
    that no longer has the name a newcomer opens."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    lock = mix_path.parent / f".{mix_path.name}.lock"
    with open(lock, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def register_side_channel(mix_path: str | os.PathLike, ref: SideChannelRef) -> Path:
    """List ``ref`` in the mix manifest at ``mix_path`` (replacing an entry of the same kind
    and split) and rewrite it atomically; entries are kept sorted by (kind, split). The
    read-modify-write holds an exclusive lock (module docstring), so concurrent
    registrations of different channels are all kept.

    Raises:
        as :func:`load_mix_manifest`.
    """
    mix_path = Path(mix_path)
    load_mix_manifest(mix_path)  # a missing or invalid manifest is named before any lock file
    with _manifest_lock(mix_path):
        m = load_mix_manifest(mix_path)
        keep = [r for r in m.side_channels if (r.kind, r.split) != (ref.kind, ref.split)]
        listed = sorted([*keep, ref], key=lambda r: (r.kind, r.split))
        return m.model_copy(update={"side_channels": listed}).write(mix_path)


class SideChannelListingError(ValueError):
    """A side channel the mix manifest lists whose bytes are not the listed ones (one line
    naming the file)."""


def verify_listed_side_channel(mix_path: str | os.PathLike, meta_path: str | os.PathLike,
                               *, hash_files: bool = True) -> dict[str, str] | None:
    """Check the side channel whose metadata file is ``meta_path`` against the mix
    manifest's listing of it, if the mix lists it (an entry whose ``path``, relative to the
    manifest's folder, is ``meta_path``): the metadata file's sha256, its ``mix_sha256``
    against :func:`mix_identity_sha256`, and every listed array file's presence and
    (``hash_files``) sha256.

    Returns:
        ``None`` when the mix does not list the side channel (nothing checked), else the
        array files checked, ``{resolved path: sha256}`` (empty with ``hash_files=False``),
        so a reader need not hash them again.

    Raises:
        SideChannelListingError: one line naming the file that is missing or whose bytes
            differ, or ``meta_path`` when made for another mix.
        as :func:`load_mix_manifest`.
    """
    mix_path, meta_path = Path(mix_path), Path(meta_path)
    m = load_mix_manifest(mix_path)
    base = mix_path.resolve().parent
    target = meta_path.resolve()
    # a folder reused for another split lists one path twice: the entry whose sha256 is
    # the metadata file's is the one that wrote it
    refs = [r for r in m.side_channels if (base / r.path).resolve() == target]
    if not refs:
        return None
    ref = refs[0]
    if len(refs) > 1 and meta_path.is_file():
        digest = sha256_file(meta_path)
        ref = next((r for r in refs if r.sha256 == digest), refs[0])
    err = SideChannelListingError
    if not meta_path.is_file():
        raise err(f"{meta_path}: missing (listed in {mix_path})")
    if sha256_file(meta_path) != ref.sha256:
        raise err(f"{meta_path}: sha256 differs from its listing in {mix_path} (the side "
                  "channel changed after it was registered)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise err(f"{meta_path}: not JSON ({e})") from None
    identity = mix_identity_sha256(mix_path)
    if not isinstance(meta, dict) or meta.get("mix_sha256") != identity:
        got = meta.get("mix_sha256") if isinstance(meta, dict) else None
        raise err(f"{meta_path}: made for the mix identity sha256 {str(got)[:12]}, "
                  f"{mix_path} has {identity[:12]}")
    checked: dict[str, str] = {}
    folder = meta_path.parent.resolve()
    for f in ref.files:
        p = (base / f.path).resolve()
        # named as the reader knows it: beside the metadata file it opened
        p = meta_path.parent / p.relative_to(folder) if p.is_relative_to(folder) else p
        if not p.is_file():
            raise err(f"{p}: missing (listed in {mix_path})")
        if hash_files:
            if sha256_file(p) != f.sha256:
                raise err(f"{p}: sha256 differs from its listing in {mix_path} (the file "
                          "changed after the side channel was registered)")
            checked[str(p.resolve())] = f.sha256
    return checked
