"""The curation manifest (a datamix's result): a pydantic model, JSON on disk, schema versioned.

One manifest describes one finished curation run: the curation config and its hash,
the tokenizer identity, and per source its origin, license, counts, tokens, mixture
weight and shards (each with split, tokens, documents and sha256). It holds no
timestamps or absolute paths, so two identical runs give byte-identical manifests.
Shard and quarantine paths are relative to the manifest's folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenmill.atomic import atomic_write_text
from tokenmill.errors import field_lines
from tokenmill.tokenizers import TokenizerIdentity

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


_M = TypeVar("_M", bound=BaseModel)


class ShardEntry(_Model):
    path: str = Field(description="shard .bin path, relative to the manifest folder")
    split: Literal["train", "val"] = Field(description="train or val")
    version: int = Field(description="1 = uint16 tokens, 2 = uint32 tokens")
    tokens: int = Field(description="tokens in the shard (its header's count)")
    documents: int = Field(description="documents in the shard (rows of its sidecar)")
    sha256: str = Field(description="sha256 of the .bin file")
    sidecar_sha256: str = Field(description="sha256 of the .docs.parquet sidecar")


class SourceCounts(_Model):
    """A source's documents: ``read`` = ``kept`` + the removed ones counted in the other
    fields. Each removal field is fed by the pipeline stages that name it as their
    ``counts`` (``tokenmill.pipeline.run.stage_list``); its ``title`` heads the summary table's
    column and ``reason_label`` (dict fields) labels its reasons below the table
    (``by_family``: licenses grouped by family there)."""

    read: int = Field(
        default=0, title="docs in",
        description="documents read (rows of the data files)")
    quarantined: dict[str, int] = Field(
        default_factory=dict, title="quarantined", description="reason -> rows",
        json_schema_extra={"reason_label": "quarantined"})
    license_rejected: dict[str, int] = Field(
        default_factory=dict, title="license rej.",
        description="per-document license -> documents rejected",
        json_schema_extra={"reason_label": "license rejected", "by_family": True})
    exact_duplicates: int = Field(
        default=0, title="exact dups",
        description="documents removed as exact duplicates of a kept one")
    near_duplicates: int = Field(
        default=0, title="near dups",
        description="documents removed as near duplicates of a kept one")
    filtered: dict[str, int] = Field(
        default_factory=dict, title="filtered", description="filter reason -> docs",
        json_schema_extra={"reason_label": "filtered"})
    kept: int = Field(default=0, title="kept", description="documents in the shards")

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


class InputFile(_Model):
    """One data file a source's documents were read from."""

    path: str = Field(description="relative to the source's folder (origin), posix; bytes "
                      "that are not UTF-8 shown as \\xNN escapes")
    size: int = Field(description="bytes")
    sha256: str = Field(description="of the file's bytes, as read; part of the cache key of "
                        "its blocks, so new bytes are curated again whatever the mtime")


class ValidationSplit(_Model):
    """How a source's validation split came about (``shards`` in the datamix)."""

    min_documents: int = Field(default=0, description="the source's minimum of validation "
                               "documents (0: none)")
    by_fraction: int = Field(default=0, description="documents the val_fraction hash put in "
                             "val")
    added: int = Field(default=0, description="documents moved from train to val, next in "
                       "the same hash order, to reach min_documents")


class SourceEntry(_Model):
    name: str = Field(description="the source's name in the datamix")
    origin: str = Field(description="local path relative to the data root, or hub:org/name")
    revision: str | None = Field(default=None, description="Hub commit sha, for Hub sources")
    license: str = Field(description="the source's license (dataset card or datamix), lowercased")
    mixture_weight: float = Field(description="the source's weight in the datamix")
    counts: SourceCounts = Field(description="documents read, removed by reason, kept")
    license_accepted: dict[str, int] = Field(
        default_factory=dict, description="per-document license -> documents kept by the gate"
    )
    pii_replacements: dict[str, int] = Field(
        default_factory=dict, description="PII class (email, ipv4, ipv6) -> spans replaced "
        "(each one an edit record in the quarantine)")
    decontamination_cuts: dict[str, int] = Field(
        default_factory=dict, description="eval set -> spans cut out of kept documents by "
        "decontamination in cut mode (each one an edit record in the quarantine; documents "
        "removed per eval set are counts.filtered's contaminated:<eval set> reasons)")
    tokens: dict[str, int] = Field(description="split -> tokens (EOT included)")
    documents: dict[str, int] = Field(description="split -> documents")
    shards: list[ShardEntry] = Field(description="the source's shards, train then val, in order")
    skipped_files: list[str] = Field(
        default_factory=list, description="files under the source not read (unsupported type)")
    files: list[InputFile] = Field(
        default_factory=list, description="the data files read, in order, with size and sha256")
    validation: ValidationSplit = Field(
        default_factory=ValidationSplit,
        description="how the validation split came about")
    stages: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-stage counters, by stage name"
    )


WarningKind = Literal["empty_file", "empty_source", "quarantine_share", "skipped_link"]


class CurationWarning(_Model):
    """An outcome a user must not miss (``tokenmill run --strict`` makes it an error):
    ``empty_file`` (a data file yields no document), ``empty_source`` (a source keeps no
    document), ``quarantine_share`` (more of a source's rows quarantined than the
    datamix's ``checks.max_quarantine_share``), ``skipped_link`` (a symbolic link in a
    source folder pointing outside it, to a missing target or in a loop: not read)."""

    kind: WarningKind = Field(description="empty_file, empty_source or quarantine_share")
    source: str = Field(description="the source it is about")
    file: str | None = Field(default=None, description="for empty_file: relative to the "
                             "source's folder")
    message: str = Field(description="one line, naming the source (and file)")


class QuarantineEntry(_Model):
    path: str = Field(description="quarantine parquet file, relative to the manifest folder")
    rows: int = Field(description="rows in it")
    sha256: str = Field(description="sha256 of the file")


class DatamixManifest(_Model):
    """A curation run's manifest (``manifest.json`` beside ``shards/``)."""

    schema_version: int = Field(
        default=SCHEMA_VERSION,
        description="version of this layout (a reader refuses another)")
    kind: Literal["curation"] = Field(default="curation", description="always curation")
    name: str = Field(description="the datamix's name")
    config: dict[str, Any] = Field(
        description="the datamix as validated, without where-things-live fields (data_root, "
        "output_dir, block sizes, dedup partitions, write_text)")
    config_sha256: str = Field(description="sha256 of config as compact JSON with sorted keys")
    tokenizer: TokenizerIdentity = Field(description="the tokenizer of every shard")
    sources: list[SourceEntry] = Field(description="per source, in datamix order")
    quarantine: list[QuarantineEntry] = Field(description="the quarantine files, one per source")
    fuzzy_dedup: dict[str, Any] | None = Field(
        default=None, description="MinHash-LSH parameters (num_perm, bands, rows, threshold, "
        "ngram, seed, hash) and counters, when fuzzy dedup ran")
    substring_dedup: dict[str, Any] | None = Field(
        default=None, description="exact-substring dedup's parameters (min_tokens, scope) "
        "and counts, in all and per source (tokens_in, tokens_removed, spans, "
        "documents_edited, documents_removed; tokens in its own tokenization, before the "
        "cut documents are tokenized again), when it ran")
    span_dedup: dict[str, Any] | None = Field(
        default=None, description="sentence-span or paragraph dedup's parameters (mode, "
        "window, min_doc_words, min_num_sentences) and counts, in all and per source "
        "(documents_in, windows, documents_edited, documents_removed, spans, "
        "chars_removed), when it ran")
    warnings: list[CurationWarning] = Field(
        default_factory=list, description="outcomes a user must not miss, in source order")

    def shards(self, split: str | None = None) -> list[ShardEntry]:
        return [s for src in self.sources for s in src.shards if split in (None, s.split)]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def write(self, folder: str | os.PathLike) -> Path:
        path = Path(folder) / MANIFEST_NAME
        atomic_write_text(path, self.to_json())
        return path


#: What each kind of JSON file is, in words, for errors naming a file of the wrong kind.
MANIFEST_KINDS: dict[str, str] = {
    "curation": "a curation manifest (`tokenmill run` writes manifest.json)",
    "training-mix": "a training-mix manifest (`tokenmill mix build` writes it)",
    "modded-nanogpt-export": "a modded-nanogpt export's export.json (`tokenmill shards "
                             "export` writes it)",
}


_MAX_FIELDS = 5  # wrong fields named in one error line (then "... and N more")


class ManifestError(ValueError):
    """A manifest file cannot be read as the kind expected; the one-line message names the
    file, then what is wrong (the other kind, the schema version, or the wrong fields by
    their path with what was expected)."""


def manifest_kind(data: dict[str, Any]) -> str:
    """The kind of a parsed manifest JSON object: its ``kind`` field; an export's
    ``export.json`` (``format: modded-nanogpt``); else ``"curation"`` (the curation
    manifest is the one kind that may lack the field)."""
    if "kind" in data:
        return str(data["kind"])
    if data.get("format") == "modded-nanogpt" and "files" in data:
        return "modded-nanogpt-export"
    return "curation"


def load_manifest_as(path: str | os.PathLike, model: type[_M]) -> _M:
    """Read a manifest of ``model``'s kind and schema version (the defaults of its
    ``kind`` and ``schema_version`` fields) from a JSON file, or from ``manifest.json`` in a
    folder.

    Raises:
        FileNotFoundError: no such file.
        ManifestError: (one line, naming the file) not JSON, not a JSON object, of another
            kind (named as such: a training-mix manifest where a curation one is expected,
            or the reverse), of another schema version, or invalid (each wrong field by its
            path with what was expected; no pydantic dump).
    """
    return cast(_M, load_manifest_of(path, (model,)))


def load_manifest_of(path: str | os.PathLike, models: tuple[type[BaseModel], ...]
                     ) -> BaseModel:
    """Read a manifest of whichever of ``models``' kinds the file says it is (read once), as
    :func:`load_manifest_as` reads one of that model; a file of none of their kinds is
    refused as the first model refuses it.

    Raises:
        FileNotFoundError, ManifestError: as :func:`load_manifest_as` with ``models[0]``
            (or with the model of the kind the file says it is).
    """
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    if not p.is_file():
        kind = models[0].model_fields["kind"].default
        raise FileNotFoundError(f"{p}: not found (expected {MANIFEST_KINDS[kind]})")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{p}: not a JSON manifest ({e})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{p}: not a manifest (a JSON {type(data).__name__}, expected "
                            "an object)")
    got = manifest_kind(data)
    model = next((m for m in models if m.model_fields["kind"].default == got), models[0])
    kind = model.model_fields["kind"].default
    version = model.model_fields["schema_version"].default
    if got != kind:
        what = MANIFEST_KINDS.get(got, f"a file of kind {got!r}")
        raise ManifestError(f"{p}: this is {what}, but {MANIFEST_KINDS[kind]} is expected here")
    if data.get("schema_version") != version:
        raise ManifestError(f"{p}: {kind} manifest schema_version "
                            f"{data.get('schema_version')!r}, expected {version} (written by "
                            "another tokenmill version?)")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        fields = "; ".join(x.strip() for x in field_lines(e, _MAX_FIELDS, model.model_fields))
        raise ManifestError(f"{p}: invalid {kind} manifest: {fields}") from None


def load_manifest(path: str | os.PathLike) -> DatamixManifest:
    """Read a curation manifest file (or a folder holding ``manifest.json``).

    Raises:
        FileNotFoundError: no manifest there.
        ManifestError: (a ``ValueError``; one line naming the file) not JSON, a manifest
            of another kind (named as such), another schema version, or invalid (each
            wrong field by its path with what was expected); see :func:`load_manifest_as`.
    """
    return load_manifest_as(path, DatamixManifest)
