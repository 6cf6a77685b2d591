"""The curation datamix manifest: a pydantic model, JSON on disk, schema versioned.

One manifest describes one finished curation run: the datamix config and its hash,
the tokenizer identity, and per source its origin, license, counts, tokens, mixture
weight and shards (each with split, tokens, documents and sha256). It holds no
timestamps or absolute paths, so two identical runs give byte-identical manifests.
Shard and quarantine paths are relative to the manifest's folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tokenmill.atomic import atomic_write_text
from tokenmill.tokenizers import TokenizerIdentity

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShardEntry(_Model):
    path: str = Field(description="shard .bin path, relative to the manifest folder")
    split: Literal["train", "val"]
    version: int = Field(description="1 = uint16 tokens, 2 = uint32 tokens")
    tokens: int
    documents: int
    sha256: str
    sidecar_sha256: str


class SourceCounts(_Model):
    """A source's documents: ``read`` = ``kept`` + the removed ones counted in the other
    fields. Each removal field is fed by the pipeline stages that name it as their
    ``counts`` (``tokenmill.pipeline.stages``); its ``title`` heads the summary table's
    column and ``reason_label`` (dict fields) labels its reasons below the table
    (``by_family``: licenses grouped by family there)."""

    read: int = Field(default=0, title="docs in")
    quarantined: dict[str, int] = Field(
        default_factory=dict, title="quarantined", description="reason -> rows",
        json_schema_extra={"reason_label": "quarantined"})
    license_rejected: dict[str, int] = Field(
        default_factory=dict, title="license rej.",
        description="per-document license -> documents rejected",
        json_schema_extra={"reason_label": "license rejected", "by_family": True})
    exact_duplicates: int = Field(default=0, title="exact dups")
    near_duplicates: int = Field(default=0, title="near dups")
    filtered: dict[str, int] = Field(
        default_factory=dict, title="filtered", description="filter reason -> docs",
        json_schema_extra={"reason_label": "filtered"})
    kept: int = Field(default=0, title="kept")

    @classmethod
    def removal_fields(cls) -> list[str]:
        """The fields counting removed documents (all but ``read`` and ``kept``), in order."""
        return [f for f in cls.model_fields if f not in ("read", "kept")]

    def removed_by(self, name: str) -> int:
        """Documents counted in field ``name`` (a count, or the sum of a reason dict)."""
        v = getattr(self, name)
        return sum(v.values()) if isinstance(v, dict) else int(v)

    def removed(self) -> int:
        """All removed documents."""
        return sum(self.removed_by(f) for f in self.removal_fields())


class SourceEntry(_Model):
    name: str
    origin: str = Field(description="local path relative to the data root, or hub:org/name")
    revision: str | None = Field(default=None, description="Hub commit sha, for Hub sources")
    license: str
    mixture_weight: float
    counts: SourceCounts
    license_accepted: dict[str, int] = Field(
        default_factory=dict, description="per-document license -> documents kept by the gate"
    )
    tokens: dict[str, int] = Field(description="split -> tokens (EOT included)")
    documents: dict[str, int] = Field(description="split -> documents")
    shards: list[ShardEntry]
    skipped_files: list[str] = Field(
        default_factory=list, description="files under the source not read (unsupported type)")
    stages: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-stage counters, by stage name"
    )


class QuarantineEntry(_Model):
    path: str
    rows: int
    sha256: str


class DatamixManifest(_Model):
    """A curation run's manifest (``manifest.json`` beside ``shards/``)."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["curation"] = "curation"
    name: str
    config: dict[str, Any]
    config_sha256: str
    tokenizer: TokenizerIdentity
    sources: list[SourceEntry]
    quarantine: list[QuarantineEntry]
    fuzzy_dedup: dict[str, Any] | None = Field(
        default=None, description="MinHash-LSH parameters (num_perm, bands, rows, threshold, "
        "ngram, seed, hash) and counters, when fuzzy dedup ran")

    def shards(self, split: str | None = None) -> list[ShardEntry]:
        return [s for src in self.sources for s in src.shards if split in (None, s.split)]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def write(self, folder: str | os.PathLike) -> Path:
        path = Path(folder) / MANIFEST_NAME
        atomic_write_text(path, self.to_json())
        return path


def load_manifest(path: str | os.PathLike) -> DatamixManifest:
    """Read a manifest file (or a folder holding ``manifest.json``).

    Raises:
        FileNotFoundError: no manifest there.
        ValueError: the schema version is not one this tokenmill reads, or the JSON is
            not a valid manifest (pydantic's message names the field).
    """
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    if not p.exists():
        raise FileNotFoundError(f"{p}: no manifest here")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not a JSON manifest ({e})") from e
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else None
        raise ValueError(f"{p}: manifest schema_version {got} is not {SCHEMA_VERSION}")
    return DatamixManifest.model_validate(data)
