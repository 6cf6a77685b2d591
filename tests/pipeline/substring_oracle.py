"""A second implementation of exact-substring dedup for the tests: every ``k``-token window
hashed (its bytes into a set) in the global document order; a window seen before marks
its tokens. Nothing of :mod:`tokenmill.pipeline.dedup.substring_spans` is used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import iter_documents


def repeated_spans(docs: list[np.ndarray], k: int, reset: list[bool] | None = None
                   ) -> list[list[tuple[int, int]]]:
    """Per document, the merged ``[start, end)`` token spans covered by a window seen
    earlier; ``reset[i]``: forget the windows seen before document ``i`` (a new scope)."""
    seen: set[bytes] = set()
    out = []
    for i, d in enumerate(docs):
        if reset is not None and reset[i]:
            seen = set()
        d = np.asarray(d, np.int64)
        mask = np.zeros(d.size, bool)
        for s in range(d.size - k + 1):
            w = d[s : s + k].tobytes()
            if w in seen:
                mask[s : s + k] = True
            else:
                seen.add(w)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
        out.append([(int(a), int(b)) for a, b in edges.reshape(-1, 2)])
    return out


def run_outputs(out: Path) -> tuple[dict, list[dict], dict[str, np.ndarray]]:
    """``(manifest dict, quarantine rows, key -> shard tokens without the leading EOT)``
    of a run's output folder."""
    manifest = json.loads((out / "manifest.json").read_text())
    rows = [r for q in manifest["quarantine"]
            for r in pq.read_table(out / q["path"]).to_pylist()]
    tokens = {key: np.asarray(t[1:], np.int64)
              for sh in load_manifest(out).shards()
              for key, t in iter_documents(out / sh.path)}
    return manifest, rows, tokens


def stage_input(out: Path, sources: list[str], removed_before: set[str]
                ) -> list[tuple[str, str]]:
    """``(key, text)`` of the documents the global stages saw (the prepared blocks under
    ``work/prepare``) less ``removed_before``, in the global order (datamix source order,
    then key)."""
    docs = {}
    for p in (out / "work" / "prepare").glob("*.docs.parquet"):
        t = pq.read_table(p, columns=["key", "text"])
        docs.update(zip(t.column("key").to_pylist(), t.column("text").to_pylist(),
                        strict=True))
    order = {s: i for i, s in enumerate(sources)}
    keys = sorted((k for k in docs if k not in removed_before),
                  key=lambda k: (order[k.split("/", 1)[0]], k))
    return [(k, docs[k]) for k in keys]
