"""Small real curation manifests for the datamix tests and the loader benchmark.

Real corpora from ``../shared/data/corpora`` are tokenized with tiktoken (EOT before
every document) and written with :func:`tokenmill.manifests.shards.write_shard` plus a
:class:`~tokenmill.manifests.schema.DatamixManifest`, one curation manifest per call.
This stands in for the main pipeline's output and can later be swapped for it.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import DatamixManifest, ShardEntry, SourceCounts, SourceEntry
from tokenmill.manifests.shards import sidecar_path, version_for_vocab, write_shard
from tokenmill.tokenizers import get_encoding, identity


def _jsonl_texts(folder: Path) -> Iterator[tuple[str, str]]:
    for f in sorted(folder.glob("data/*.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for row, line in enumerate(fh):
                if line.strip():
                    yield f"{f.name}#{row}", json.loads(line)["text"]


def _files(folder: Path, pattern: str) -> Iterator[tuple[str, str]]:
    for f in sorted((folder / "data").glob(pattern)):
        yield f"{f.relative_to(folder / 'data')}#0", f.read_text(encoding="utf-8",
                                                                 errors="replace")


READERS = {
    "c4-en-sample": _jsonl_texts,
    "cc-main-2019-sample": _jsonl_texts,
    "wikipedia-wikitext-sample": lambda f: _files(f, "**/*.txt"),
    "python-docs-rst": lambda f: _files(f, "**/*.rst.txt"),
    "books-public-domain": lambda f: _files(f, "**/*.txt"),
    "linux-docs-rst": lambda f: _files(f, "**/*.rst.txt"),
}


def write_curation(corpora_root: Path, out: Path, name: str, sources: dict[str, int | None],
                   encoding: str = "gpt2", val_every: int = 20,
                   max_shard_tokens: int = 150_000) -> Path:
    """Tokenize ``sources`` (corpus -> max documents or None) into shards + manifest.json.

    Every ``val_every``-th document goes to val; train shards are cut at
    ``max_shard_tokens`` (document-aligned). Returns the manifest path.
    """
    texts = {src: list(itertools.islice(READERS[src](corpora_root / src), limit))
             for src, limit in sources.items()}
    return write_texts_curation(out, name, texts, encoding, val_every, max_shard_tokens)


def write_texts_curation(out: Path, name: str, sources: dict[str, list[tuple[str, str]]],
                         encoding: str = "gpt2", val_every: int = 20,
                         max_shard_tokens: int = 150_000) -> Path:
    """:func:`write_curation` for given texts: source -> [(key, text)]."""
    enc = get_encoding(encoding)
    ident = identity(encoding)
    version = version_for_vocab(ident.n_vocab)
    entries: list[SourceEntry] = []
    for src, docs in sources.items():
        ids = enc.encode_ordinary_batch([t for _, t in docs], num_threads=2)
        splits: dict[str, list[tuple[str, list[int]]]] = {"train": [], "val": []}
        for i, ((key, _), toks) in enumerate(zip(docs, ids, strict=True)):
            splits["val" if i % val_every == val_every - 1 else "train"].append(
                (f"{src}/{key}", toks))
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
                rel = f"shards/{src}/{split}_{c:04d}.bin"
                write_shard(out / rel, tokens, version, np.array(offsets, np.uint64),
                            [k for k, _ in chunk])
                shards.append(ShardEntry(
                    path=rel, split=split, version=version, tokens=int(tokens.size),
                    documents=len(chunk), sha256=sha256_file(out / rel),
                    sidecar_sha256=sha256_file(sidecar_path(out / rel))))
        entries.append(SourceEntry(
            name=src, origin=f"corpora/{src}", license="see dataset card",
            mixture_weight=1.0, counts=SourceCounts(read=len(docs), kept=len(docs)),
            tokens={s: sum(x.tokens for x in shards if x.split == s) for s in splits},
            documents={s: sum(x.documents for x in shards if x.split == s) for s in splits},
            shards=shards))
    manifest = DatamixManifest(name=name, config={"sources": list(sources)},
                               config_sha256="0" * 64, tokenizer=ident, sources=entries,
                               quarantine=[])
    return manifest.write(out)


def write_test_curations(corpora_root: Path, out: Path) -> dict[str, Path]:
    """The test set: ``web`` (c4, gpt2), ``ref`` (wikipedia + 150 python docs, gpt2) and
    ``wiki100k`` (wikipedia, cl100k_base). Returns name -> manifest path."""
    return {
        "web": write_curation(corpora_root, out / "web", "web", {"c4-en-sample": None}),
        "ref": write_curation(corpora_root, out / "ref", "ref",
                              {"wikipedia-wikitext-sample": None, "python-docs-rst": 150}),
        "wiki100k": write_curation(corpora_root, out / "wiki100k", "wiki100k",
                                   {"wikipedia-wikitext-sample": None},
                                   encoding="cl100k_base"),
    }


_CACHE: dict[str, Path] = {}


def cached_test_curations(corpora_root: Path) -> dict[str, Path]:
    """:func:`write_test_curations` once per test process, in a temporary folder
    removed at exit (shared by the datamix, export and loader tests)."""
    if not _CACHE:
        import atexit
        import shutil
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="tokenmill-mixdata-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        _CACHE.update(write_test_curations(corpora_root, tmp))
    return dict(_CACHE)


def write_spec(path: Path, manifests: list[Path], sources: dict[str, dict], target_tokens: int,
               seed: int = 7, **extra) -> Path:
    """Write a mix spec YAML (manifest paths made absolute) and return its path."""
    import yaml

    spec = {"name": path.stem, "manifests": [str(m) for m in manifests], "seed": seed,
            "target_tokens": int(target_tokens), "sources": sources, **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
