"""The training-mix manifest: the on-disk format ``tokenmill mix build`` writes.

JSON (sorted keys, no timestamps, paths relative to its own folder): same inputs, same
bytes. ``kind`` is ``"training-mix"`` (a curation manifest's is ``"curation"``). It lists,
per mix source, the curation shards with the document-aligned token ranges a trainer may
read, the effective weight schedule, and the sha256 of every curation manifest, shard and
sidecar it references. Planning lives in :mod:`tokenmill.manifests.mix`; reading shards
through it, verified, in :mod:`tokenmill.manifests.verify`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenmill.atomic import atomic_write_text
from tokenmill.manifests.schema import load_manifest_as
from tokenmill.tokenizers import TokenizerIdentity

MIX_SCHEMA_VERSION = 1
MIX_KIND = "training-mix"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MixShard(_Model):
    path: str = Field(description="shard .bin path, relative to the training manifest folder")
    split: Literal["train", "val"]
    version: int
    tokens: int = Field(description="tokens in the whole shard")
    documents: int
    sha256: str
    sidecar_sha256: str
    start: int = Field(description="first token of the usable range (a document start)")
    end: int = Field(description="end (exclusive) of the usable range (a document end)")
    range_tokens: int
    range_documents: int


class MixSource(_Model):
    name: str = Field(description="name in the mix spec")
    manifest: int = Field(description="index into curation_manifests")
    source: str = Field(description="source name in the curation manifest")
    weight: float = Field(description="requested share at token 0 (normalized)")
    requested_share: float = Field(description="requested tokens / requested total")
    max_epochs: float
    available_tokens: int = Field(description="train tokens of the source (EOT included)")
    available_documents: int
    requested_tokens: int
    epochs_needed: float = Field(description="requested_tokens / available_tokens")
    granted_tokens: int
    epochs: float = Field(description="granted_tokens / available_tokens (fractional)")
    effective_weight: float = Field(description="granted_tokens / total_tokens")
    shortfall_tokens: int
    shards: list[MixShard] = Field(description="train shards with the token ranges to use")
    val_shards: list[MixShard]


class MixSegment(_Model):
    start_token: int = Field(description="first token of this segment in the mixed stream")
    tokens: int
    weights: dict[str, float] = Field(description="effective weight per source (sums to 1)")


class CurationRef(_Model):
    name: str
    path: str = Field(description="relative to the training manifest folder")
    sha256: str


class TrainingMixManifest(_Model):
    """A training-mix manifest (``tokenmill mix build``): a mix spec planned over
    curation manifests."""

    schema_version: int = MIX_SCHEMA_VERSION
    kind: Literal["training-mix"] = "training-mix"
    name: str
    spec: dict[str, Any]
    spec_sha256: str
    seed: int
    target_tokens: int
    total_tokens: int
    tokenizer: TokenizerIdentity
    curation_manifests: list[CurationRef]
    sources: list[MixSource]
    segments: list[MixSegment]
    warnings: list[str]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

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
