"""Content-addressed, verified intermediate files (after Marin's versioned steps).

A stage's output for one unit of work lives at ``work/<stage>/<hash>.*`` where the hash
covers the stage's versioned config and its inputs. A ``<hash>.done.json`` written last
records the sha256 of every file of that output; an output is reused only when its done
file exists and every checksum matches. A truncated or corrupted file is reported by
path and the unit is recomputed, never consumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill import storage
from tokenmill.atomic import atomic_open, atomic_write_text, sha256_file

log = logging.getLogger(__name__)


def content_hash(*parts: Any) -> str:
    """sha256 (hex, first 32 chars) of JSON-serialized ``parts``."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class StageOutput:
    """The files of one (stage, unit) output under ``work/<stage>/``."""

    def __init__(self, work: str | os.PathLike, stage: str, digest: str) -> None:
        self.dir = storage.local_dir(work) / stage
        #: the output's folder in the object store (``None``: ``work`` is local)
        self.remote = storage.join(work, stage) if storage.is_url(work) else None
        self.digest = digest
        self.problem: str | None = None  # why an existing output was not reusable

    def path(self, suffix: str) -> Path:
        """The local file of ``suffix`` (downloaded first when only the store has it)."""
        p = self.dir / f"{self.digest}{suffix}"
        if self.remote is not None and not p.exists():
            storage.fetch(f"{self.remote}/{p.name}", p)
        return p

    @property
    def done_path(self) -> Path:
        return self.dir / f"{self.digest}.done.json"

    def load_done(self) -> dict[str, Any] | None:
        """The done record if this output is complete and intact, else ``None``.

        Corrupt or missing files are logged by path (they will be recomputed).
        """
        if self.remote is not None:  # the store's record is the commit: always read anew
            self.done_path.unlink(missing_ok=True)
            storage.fetch(f"{self.remote}/{self.done_path.name}", self.done_path)
        if not self.done_path.exists():
            return None
        try:
            done = json.loads(self.done_path.read_text())
            for name, digest in done["files"].items():
                p = self.path(name.removeprefix(self.digest))
                if not p.exists():
                    self.problem = f"{p}: missing"
                    log.warning("intermediate %s is missing; recomputing", p)
                    return None
                if sha256_file(p) != digest:
                    self.problem = f"{p}: fails its checksum"
                    log.warning("intermediate %s fails its checksum; recomputing", p)
                    return None
        except (OSError, ValueError, KeyError) as e:
            self.problem = f"{self.done_path}: unreadable ({e})"
            log.warning("intermediate record %s unreadable (%s); recomputing", self.done_path, e)
            return None
        return done

    def commit(self, files: list[str], info: dict[str, Any]) -> dict[str, Any]:
        """Record ``files`` (suffixes) with their sha256 and ``info``; written last."""
        done = {"files": {self.path(s).name: sha256_file(self.path(s)) for s in files},
                "info": info}
        text = json.dumps(done, sort_keys=True)
        if self.remote is not None:  # content first, the record last
            for s in files:
                storage.upload(self.path(s), f"{self.remote}/{self.path(s).name}")
            storage.write_bytes(f"{self.remote}/{self.done_path.name}", text.encode())
        atomic_write_text(self.done_path, text)
        return done


def work_file(work: str, rel: str) -> Path:
    """The local file of ``rel`` (a posix path under ``work``), downloaded first when
    ``work`` is a URL and this node has no copy yet."""
    p = storage.local_dir(work) / rel
    if storage.is_url(work) and not p.exists():
        storage.fetch(storage.join(work, rel), p)
    return p


def write_parquet(path: Path, table: pa.Table) -> None:
    """Write ``table`` atomically as zstd parquet."""
    with atomic_open(path) as f:
        pq.write_table(table, f, compression="zstd")


def fault_injection_delay() -> None:
    """``TOKENMILL_TASK_DELAY_S``: seconds each task sleeps first. Only for fault-injection
    tests (killing a worker mid-task needs a task that lasts); never set in production."""
    delay = float(os.environ.get("TOKENMILL_TASK_DELAY_S", "0") or 0)
    if delay > 0:
        time.sleep(delay)
