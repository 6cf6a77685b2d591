"""An output folder in an object store, seen from the driver: the run's files that this
node needs locally (the report and the Hub-layout text read shards, sidecars and
quarantine files) are downloaded into its staging folder (:func:`tokenmill.storage.local_dir`)
and checked against the manifest's sha256; what the driver writes after the manifest
(report, text) is uploaded.
"""

from __future__ import annotations

from pathlib import Path

from tokenmill import storage
from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import DatamixManifest
from tokenmill.manifests.shards import sidecar_path


def _listed(manifest: DatamixManifest) -> list[tuple[str, str]]:
    """``(relative path, sha256)`` of every shard, sidecar and quarantine file."""
    out = []
    for src in manifest.sources:
        for sh in src.shards:
            out.append((sh.path, sh.sha256))
            out.append((sidecar_path(sh.path).as_posix(), sh.sidecar_sha256))
    out += [(q.path, q.sha256) for q in manifest.quarantine]
    return out


def fetch_outputs(out: str, manifest: DatamixManifest) -> None:
    """Download each file ``manifest`` lists that this node's staging copy of ``out``
    lacks or holds with other bytes (nothing for a local ``out``).

    Raises:
        StorageError: a file cannot be read (one line naming its URL).
    """
    if not storage.is_url(out):
        return
    local = storage.local_dir(out)
    for rel, sha in _listed(manifest):
        p = local / rel
        if not p.is_file() or sha256_file(p) != sha:
            storage.download(storage.join(out, rel), p)


def publish(out: str, files: list[Path]) -> None:
    """Upload ``files`` (below this node's staging copy of ``out``) to ``out``."""
    if not storage.is_url(out):
        return
    local = storage.local_dir(out)
    storage.upload_tree(local, out, [Path(f).relative_to(local).as_posix() for f in files])


def publish_folder(out: str, folder: Path) -> None:
    """Make ``out``'s copy of the staging ``folder`` (below ``out``'s staging copy) hold
    exactly its files: each uploaded, the store's others deleted."""
    if not storage.is_url(out):
        return
    rel = folder.relative_to(storage.local_dir(out)).as_posix()
    remote = storage.join(out, rel)
    names = list(storage.list_tree(folder))
    storage.upload_tree(folder, remote, names)
    for extra in set(storage.list_tree(remote)) - set(names):
        storage.remove(storage.join(remote, extra))
