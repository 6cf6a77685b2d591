"""Shared pieces of the export tests: a small real-corpus mix and the loader's documents.

The expected documents come from tokenmill's loader itself (:class:`MixLoader` with
``provenance=True``: its batches cut at its own piece boundaries) and, for val, from the
curated shards the mix lists; never from the exporter's code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.manifests.mixdata import write_spec
from tokenmill.manifests.mix import build_mix
from tokenmill.manifests.mixschema import load_mix_manifest
from tokenmill.manifests.shards import read_sidecar, read_tokens

REPO = Path(__file__).resolve().parents[2]

SOURCES = {
    "c4": {"source": "c4-en-sample", "weight": 0.5, "max_epochs": 3},
    "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.3, "max_epochs": 3},
    "py": {"source": "python-docs-rst", "weight": 0.2, "max_epochs": 3},
}


def build_test_mix(cur: dict[str, Path], tmp: Path, target_tokens: int = 400_000,
                   wide: bool = False) -> Path:
    """A mix of the shared curations (gpt2; ``wide``: wikipedia in cl100k_base)."""
    if wide:
        spec = write_spec(tmp / "wide.yaml", [cur["wiki100k"]],
                          {"wiki": {"source": "wikipedia-wikitext-sample", "weight": 1.0}},
                          target_tokens)
        build_mix(spec, tmp / "wide.json")
        return tmp / "wide.json"
    spec = write_spec(tmp / "mix.yaml", [cur["web"], cur["ref"]], SOURCES, target_tokens)
    build_mix(spec, tmp / "mix.json")
    return tmp / "mix.json"


def loader_documents(mix: Path, seq_len: int = 2048, batch_size: int = 1,
                     remainder: str = "carry") -> list[np.ndarray]:
    """The train documents of tokenmill's loader, in its order: each batch's rows cut at
    the loader's own pieces (a whole document, a head, or an EOT-prefixed tail)."""
    from tokenmill.train.data import MixLoader

    out = []
    for b in MixLoader(mix, seq_len=seq_len, batch_size=batch_size, remainder=remainder,
                       provenance=True):
        flat = np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1).reshape(-1)
        lens = b["pieces"][:, 3] + b["pieces"][:, 4]
        assert int(lens.sum()) == flat.size
        out += np.split(flat, np.cumsum(lens)[:-1])
    return out


def loader_rows(mix: Path, split: str, seq_len: int, batch_size: int = 1) -> np.ndarray:
    """The loader's rows of ``seq_len + 1`` tokens, [rows, seq_len + 1] int64."""
    from tokenmill.train.data import MixLoader

    rows = [np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
            for b in MixLoader(mix, seq_len=seq_len, batch_size=batch_size, split=split)]
    return np.concatenate(rows).astype(np.int64)


def val_documents(mix: Path) -> list[np.ndarray]:
    """Every val document inside the mix's ranges, in manifest order, from the shards."""
    m = load_mix_manifest(mix)
    out = []
    for s in m.sources:
        for sh in s.val_shards:
            p = mix.parent / sh.path
            toks, side = read_tokens(p), read_sidecar(p)
            for off, n in zip(side.column("offset").to_pylist(),
                              side.column("n_tokens").to_pylist(), strict=True):
                if off >= sh.start and off + n <= sh.end:
                    out.append(np.asarray(toks[off:off + n], np.int64))
    return out


def assert_same_documents(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(np.asarray(g, np.int64), w), f"document {i} differs"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m tokenmill.cli ARGS`` as a user runs it (repo first on the path)."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, env=full, timeout=600)
