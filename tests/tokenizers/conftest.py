"""Fixtures of the legality-table tests: built tables (cached per session), the real corpora
encoded once per tokenizer, and a small datamix (manifest + shards) made from real corpora.

The shard fixture writes shards with the existing ``write_shard`` and ``DatamixManifest``
(EOT before every document) so that it can later be swapped for the pipeline's own output.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.shared import corpora, shared_data

os.environ.setdefault("NUMBA_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def corpus_docs() -> list[tuple[str, str]]:
    """Every document of every corpus under ../shared/data/corpora."""
    from tests.tokenizers.legality_corpus import iter_corpus_documents

    root = shared_data("corpora")
    docs = list(iter_corpus_documents(root))
    assert len(docs) > 6000
    return docs


def _encode_pairs(name: str, docs: list[tuple[str, str]]):
    from tokenmill.tokenizers import get_encoding

    enc = get_encoding(name)
    toks = enc.encode_ordinary_batch([d for _, d in docs], num_threads=2)
    prev = np.concatenate([np.asarray(t[:-1], np.int64) for t in toks if len(t) > 1])
    nxt = np.concatenate([np.asarray(t[1:], np.int64) for t in toks if len(t) > 1])
    owner = np.concatenate([np.full(len(t) - 1, i) for i, t in enumerate(toks) if len(t) > 1])
    return prev, nxt, owner


@pytest.fixture(scope="session")
def gpt2_corpus_pairs(corpus_docs):
    """``(prev, next, doc index)`` of every adjacent pair of the corpora encoded with gpt2."""
    return _encode_pairs("gpt2", corpus_docs)


@pytest.fixture(scope="session")
def cl100k_corpus_pairs(corpus_docs):
    return _encode_pairs("cl100k_base", corpus_docs)


@pytest.fixture(scope="session")
def gpt2_table_path(tmp_path_factory) -> Path:
    """The full gpt2 table, built and saved through the CLI (``tokenmill legality build``)."""
    from tests.conftest import build_once
    from tokenmill.cli import main

    shared_data("tiktoken")

    def build(out: Path) -> None:
        assert main(["legality", "build", "gpt2", "-o", str(out), "--quiet"]) == 0

    return build_once(tmp_path_factory, "gpt2-legality", build) / "gpt2.legality"


@pytest.fixture(scope="session")
def gpt2_table(gpt2_table_path):
    """The saved gpt2 table, memory-mapped back."""
    from tokenmill.tokenizers.legality import LegalityTable

    return LegalityTable.load(gpt2_table_path, encoding="gpt2")


@pytest.fixture(scope="session")
def cl100k_table(cl100k_corpus_pairs):
    """cl100k_base rows for every previous token seen in the corpora plus 2,000 random rows
    (a row-subset build keeps the suite fast; the benchmark builds the full table). Its
    tests live in one file (with ``--dist worksteal`` each worker may still build it once)."""
    from tokenmill.tokenizers import get_encoding
    from tokenmill.tokenizers.legality import LegalityTable

    prev = cl100k_corpus_pairs[0]
    rng = np.random.default_rng(7)
    V = get_encoding("cl100k_base").n_vocab
    rows = np.union1d(np.unique(prev), rng.choice(V, 2000, replace=False))
    return LegalityTable.build("cl100k_base", rows=rows)


@pytest.fixture(scope="session")
def small_datamix(tmp_path_factory) -> Path:
    """A manifest + gpt2 shards (2 train, 1 val) tokenized from real corpora."""
    import hashlib
    import itertools

    from tests.tokenizers.legality_corpus import iter_corpus_documents
    from tokenmill.atomic import sha256_file
    from tokenmill.manifests.schema import DatamixManifest, ShardEntry, SourceCounts, SourceEntry
    from tokenmill.manifests.shards import sidecar_path, version_for_vocab, write_shard
    from tokenmill.tokenizers import get_encoding, identity

    enc = get_encoding("gpt2")
    ident = identity("gpt2")
    out = tmp_path_factory.mktemp("datamix")
    picks = {
        "c4-en-sample": 200,
        "naughty-strings": 600,
        "wikipedia-wikitext-sample": 15,
        "books-public-domain": 3,
    }
    sources = []
    for si, (name, n) in enumerate(picks.items()):
        docs = list(itertools.islice(iter_corpus_documents(corpora(name)), n))
        toks = enc.encode_ordinary_batch([d for _, d in docs], num_threads=2)
        shards = []
        halves = [(docs, toks)] if si else [(docs[:100], toks[:100]), (docs[100:], toks[100:])]
        for hi, (ds, ts) in enumerate(halves):
            stream, offsets = [], []
            pos = 0
            for t in ts:
                offsets.append(pos)
                stream.append(enc.eot_token)
                stream.extend(t)
                pos += len(t) + 1
            rel = f"shards/{name}_{hi:03d}.bin"
            path = out / rel
            version = version_for_vocab(ident.n_vocab)
            write_shard(path, np.asarray(stream), version, np.asarray(offsets, np.uint64),
                        [f"{name}/{k}" for k, _ in ds])
            split = "val" if (si == 0 and hi == 1) else "train"
            shards.append(ShardEntry(path=rel, split=split, version=version, tokens=len(stream),
                                     documents=len(ds), sha256=sha256_file(path),
                                     sidecar_sha256=sha256_file(sidecar_path(path))))
        sources.append(SourceEntry(
            name=name, origin=f"corpora/{name}", license="see dataset card",
            mixture_weight=1.0, counts=SourceCounts(read=len(docs), kept=len(docs)),
            tokens={s.split: s.tokens for s in shards},
            documents={s.split: s.documents for s in shards}, shards=shards))
    config = {"test": "legality small datamix", "picks": picks}
    man = DatamixManifest(name="legality-test", config=config,
                          config_sha256=hashlib.sha256(repr(config).encode()).hexdigest(),
                          tokenizer=ident, sources=sources, quarantine=[])
    man.write(out)
    return out
