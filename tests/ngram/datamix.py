"""A quickstart-like datamix for the n-gram benchmark (and tests that want one without
running the pipeline): real corpora tokenized straight into shards + a manifest, by the
same writer the datamix tests use (:func:`tests.manifests.mixdata.write_curation`)."""

from __future__ import annotations

from pathlib import Path

from tests.manifests.mixdata import write_curation


def write_datamix(corpora_root: Path, out: Path, sources: list[str], encoding: str = "gpt2",
                  val_every: int = 20, max_shard_tokens: int = 1_500_000) -> Path:
    """Tokenize every document of ``sources`` into shards + ``manifest.json`` under ``out``
    (every ``val_every``-th document to val). Returns the manifest path."""
    return write_curation(corpora_root, out, "ngram-test-quickstart",
                          dict.fromkeys(sources), encoding=encoding, val_every=val_every,
                          max_shard_tokens=max_shard_tokens)
