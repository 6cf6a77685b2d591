from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.ngram.datamix import write_datamix
from tests.shared import corpora

QUICKSTART_SOURCES = [
    "c4-en-sample", "cc-main-2019-sample", "wikipedia-wikitext-sample", "books-public-domain",
]


@pytest.fixture(scope="session")
def quickstart(quickstart) -> Path:
    """Manifest path of the quickstart datamix as `tokenmill run` curates it (the
    session-wide pipeline run of tests/conftest.py)."""
    return quickstart.manifest_path


@pytest.fixture(scope="session")
def quickstart_like(tmp_path_factory) -> Path:
    """A small quickstart-like gpt2 datamix written directly from real corpora."""
    root = corpora()
    out = tmp_path_factory.mktemp("ngram_quickstart")
    return write_datamix(root, out, QUICKSTART_SOURCES)


@pytest.fixture(scope="session")
def train_stream(quickstart) -> np.ndarray:
    """All train shards of the quickstart datamix concatenated, int32 (manifest order)."""
    from tokenmill.manifests.schema import load_manifest
    from tokenmill.manifests.shards import read_tokens

    m = load_manifest(quickstart)
    return np.concatenate([np.asarray(read_tokens(quickstart.parent / s.path), dtype=np.int32)
                           for s in m.shards("train")])


@pytest.fixture(scope="session")
def small_datamix(tmp_path_factory) -> Path:
    """A manifest + gpt2 shards (2 train, 1 val) tokenized from real corpora (the legality
    tests' datamix, built by the same code)."""
    from tests.tokenizers.conftest import small_datamix as make

    return make.__wrapped__(tmp_path_factory)
