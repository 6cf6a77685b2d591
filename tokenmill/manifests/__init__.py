"""Datamix manifests: schema, validation and reading."""

from tokenmill.manifests.schema import (
    MANIFEST_NAME,
    DatamixManifest,
    ShardEntry,
    SourceEntry,
    load_manifest,
)

__all__ = ["MANIFEST_NAME", "DatamixManifest", "ShardEntry", "SourceEntry", "load_manifest"]
