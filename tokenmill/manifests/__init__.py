"""Manifests: every on-disk format (shards, sidecars, the curation manifest, the
training-mix manifest) and the one verified way to open a manifest's shards."""

from tokenmill.manifests.schema import (
    MANIFEST_NAME,
    DatamixManifest,
    ShardEntry,
    SourceEntry,
    load_manifest,
)
from tokenmill.manifests.verify import OpenedShards, ShardVerifyError, VerifiedShard, open_shards

__all__ = ["MANIFEST_NAME", "DatamixManifest", "OpenedShards", "ShardEntry", "ShardVerifyError",
           "SourceEntry", "VerifiedShard", "load_manifest", "open_shards"]
