"""A quickstart-like datamix for the n-gram tests and benchmark.

Real corpora from ``../shared/data/corpora`` are tokenized with tiktoken (EOT before
every document) and written with :func:`tokenmill.pipeline.shards.write_shard` plus a
:class:`~tokenmill.manifests.schema.DatamixManifest`. This stands in for the main
pipeline's quickstart output and can later be swapped for it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import DatamixManifest, ShardEntry, SourceCounts, SourceEntry
from tokenmill.pipeline.shards import sidecar_path, version_for_vocab, write_shard
from tokenmill.tokenizers import get_encoding, identity


def _jsonl_texts(folder: Path) -> Iterator[tuple[str, str]]:
    for f in sorted(folder.glob("data/*.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for row, line in enumerate(fh):
                if line.strip():
                    yield f"{f.name}#{row}", json.loads(line)["text"]


def _txt_files(folder: Path, pattern: str = "**/*.txt") -> Iterator[tuple[str, str]]:
    for f in sorted((folder / "data").glob(pattern)):
        yield f"{f.relative_to(folder / 'data')}#0", f.read_text(encoding="utf-8", errors="replace")


READERS = {
    "c4-en-sample": _jsonl_texts,
    "cc-main-2019-sample": _jsonl_texts,
    "wikipedia-wikitext-sample": _txt_files,
    "books-public-domain": _txt_files,
    "linux-docs-rst": _txt_files,
}


def write_datamix(
    corpora_root: Path,
    out: Path,
    sources: list[str],
    encoding: str = "gpt2",
    val_every: int = 20,
    max_shard_tokens: int = 1_500_000,
) -> Path:
    """Tokenize ``sources`` and write shards + ``manifest.json`` under ``out``.

    Every ``val_every``-th document goes to the val split; train shards are cut at
    ``max_shard_tokens`` (document-aligned). Returns the manifest path.
    """
    enc = get_encoding(encoding)
    ident = identity(encoding)
    version = version_for_vocab(ident.n_vocab)
    entries: list[SourceEntry] = []
    for name in sources:
        docs = list(READERS[name](corpora_root / name))
        ids = enc.encode_ordinary_batch([t for _, t in docs], num_threads=2)
        splits: dict[str, list[tuple[str, list[int]]]] = {"train": [], "val": []}
        for i, ((key, _), toks) in enumerate(zip(docs, ids, strict=True)):
            splits["val" if i % val_every == val_every - 1 else "train"].append(
                (f"{name}/{key}", toks))
        shards: list[ShardEntry] = []
        for split, items in splits.items():
            chunks: list[list[tuple[str, list[int]]]] = [[]]
            size = 0
            for item in items:
                if size and size + len(item[1]) + 1 > max_shard_tokens:
                    chunks.append([])
                    size = 0
                chunks[-1].append(item)
                size += len(item[1]) + 1
            for c, chunk in enumerate(chunks):
                if not chunk:
                    continue
                parts, offsets, pos = [], [], 0
                for _, toks in chunk:
                    offsets.append(pos)
                    parts.append(np.array([ident.eot_token, *toks], dtype=np.int64))
                    pos += len(toks) + 1
                tokens = np.concatenate(parts)
                rel = f"shards/{name}/{split}_{c:04d}.bin"
                write_shard(out / rel, tokens, version, np.array(offsets, np.uint64),
                            [k for k, _ in chunk])
                shards.append(ShardEntry(
                    path=rel, split=split, version=version, tokens=int(tokens.size),
                    documents=len(chunk), sha256=sha256_file(out / rel),
                    sidecar_sha256=sha256_file(sidecar_path(out / rel))))
        entries.append(SourceEntry(
            name=name, origin=f"corpora/{name}", license="see dataset card",
            mixture_weight=1.0, counts=SourceCounts(read=len(docs), kept=len(docs)),
            tokens={s: sum(x.tokens for x in shards if x.split == s) for s in splits},
            documents={s: sum(x.documents for x in shards if x.split == s) for s in splits},
            shards=shards))
    manifest = DatamixManifest(name="ngram-test-quickstart", config={"sources": sources},
                               config_sha256="0" * 64, tokenizer=ident, sources=entries,
                               quarantine=[])
    return manifest.write(out)
