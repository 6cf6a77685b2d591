"""`tokenmill shards export --format olmo` (the Dolma layout), read back with OLMo's reader."""

from __future__ import annotations

import gzip
import json
from importlib.util import find_spec

import numpy as np
import pytest

from tests.manifests.exportdata import (
    assert_same_documents,
    build_test_mix,
    loader_documents,
    loader_rows,
    run_cli,
    val_documents,
)
from tests.manifests.mixdata import cached_test_curations
from tests.shared import corpora

# OLMo's reader is imported by the tests that read (not by every worker at collection)
pytestmark = pytest.mark.skipif(
    find_spec("olmo_core") is None,
    reason="ai2-olmo-core (the dev extra) is not installed: OLMo's reader is the reference")

EOT = 50256


@pytest.fixture(scope="module")
def cur():
    return cached_test_curations(corpora("c4-en-sample").parent)


@pytest.fixture(scope="module")
def exported(cur, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("olmo")
    mix = build_test_mix(cur, tmp)
    r = run_cli("shards", "export", "--format", "olmo", str(mix), "-o", str(tmp / "out"),
                "--shard-tokens", "150000")
    assert r.returncode == 0, r.stderr
    return mix, tmp / "out"


def _documents(folder, dtype) -> list[np.ndarray]:
    """Every document of a split by OLMo's document table reader, file after file."""
    from olmo_core.data import utils as olmo_utils

    docs = []
    for path in sorted(folder.glob("part-*.npy")):
        for start, end in olmo_utils.iter_document_indices(path, use_array_if_local=False,
                                                           dtype=dtype):
            docs.append(olmo_utils.load_array_slice(path, start, end, dtype))
    return docs


def test_olmo_reads_the_loaders_documents(exported):
    mix, out = exported
    assert len(list((out / "train").glob("part-*.npy"))) >= 3
    assert_same_documents(_documents(out / "train", np.uint16), loader_documents(mix))
    assert_same_documents(_documents(out / "val", np.uint16), val_documents(mix))
    # the table's other columns: key, mix source, offset in the original document
    with gzip.open(out / "train" / "part-00000.csv.gz", "rt") as f:
        first = f.readline().rstrip("\n").split(",")
    assert first[:2] == ["0", first[1]] and first[3] in ("c4", "wiki", "py")
    listed = json.loads((out / "export.json").read_text())
    assert {f["path"] for f in listed["files"]} == {
        p.relative_to(out).as_posix() for p in out.rglob("part-*")}


def test_olmo_fixed_length_instances_are_the_loaders_rows(exported):
    """OLMo's pretraining dataset (NumpyFSLDataset: each file cut into instances of one
    length) over the train files yields exactly the loader's rows of seq_len + 1 tokens."""
    from olmo_core.data.numpy_dataset import NumpyFSLDataset

    mix, out = exported
    paths = sorted((out / "train").glob("part-*.npy"))
    ds = NumpyFSLDataset(*paths, sequence_length=2049, pad_token_id=EOT, eos_token_id=EOT,
                         vocab_size=50257, dtype=np.uint16)
    got = np.stack([ds[i]["input_ids"].numpy() for i in range(len(ds))]).astype(np.int64)
    np.testing.assert_array_equal(got, loader_rows(mix, "train", seq_len=2048))


def test_olmo_uint32_for_wide_vocabularies(cur, tmp_path):
    mix = build_test_mix(cur, tmp_path, target_tokens=60_000, wide=True)
    r = run_cli("shards", "export", "--format", "olmo", str(mix), "-o", str(tmp_path / "o"),
                "--splits", "train", "--seq-len", "512")
    assert r.returncode == 0, r.stderr
    docs = _documents(tmp_path / "o" / "train", np.uint32)
    assert max(int(d.max()) for d in docs) > 65_535
    assert_same_documents(docs, loader_documents(mix, seq_len=512))
