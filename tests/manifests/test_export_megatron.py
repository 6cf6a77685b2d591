"""`tokenmill shards export --format megatron`, read back with Megatron-LM's own reader."""

from __future__ import annotations

import json
import struct
from importlib.util import find_spec

import numpy as np
import pytest

from tests.manifests.exportdata import (
    assert_same_documents,
    build_test_mix,
    loader_documents,
    run_cli,
    val_documents,
)
from tests.manifests.mixdata import cached_test_curations
from tests.shared import corpora

# Megatron's reader is imported by the tests that read (megatron.core imports torch and
# more: seconds that every pytest worker would spend at collection)
pytestmark = [
    pytest.mark.skipif(
        find_spec("megatron") is None,
        reason="megatron-core (the dev extra) is not installed: Megatron's reader is the "
               "reference"),
    # what megatron.core (and torch.jit on its behalf) says on import: not ours
    pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron",
                               "ignore::UserWarning:megatron",
                               "ignore::DeprecationWarning:torch.jit"),
]


@pytest.fixture(scope="module")
def cur():
    return cached_test_curations(corpora("c4-en-sample").parent)


@pytest.fixture(scope="module")
def exported(cur, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("megatron")
    mix = build_test_mix(cur, tmp)
    r = run_cli("shards", "export", "--format", "megatron", str(mix), "-o", str(tmp / "out"))
    assert r.returncode == 0, r.stderr
    return mix, tmp / "out", r


def _read(prefix) -> list[np.ndarray]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    assert list(ds.document_indices) == list(range(len(ds) + 1))  # one sequence per document
    return [np.array(ds[i]) for i in range(len(ds))]  # copies: ds unmaps its file when freed


def test_megatron_reads_the_loaders_documents(exported):
    mix, out, r = exported
    assert "c4" in r.stdout
    train = _read(out / "train")
    assert train[0].dtype == np.uint16  # gpt2: 50,257 ids < 65,500
    assert_same_documents(train, loader_documents(mix))
    assert_same_documents(_read(out / "val"), val_documents(mix))
    listed = json.loads((out / "export.json").read_text())
    assert listed["format"] == "megatron"
    assert {f["path"] for f in listed["files"]} == {"train.bin", "train.idx", "val.bin",
                                                     "val.idx"}


def test_megatron_index_is_version_1_and_int32_above_65500_ids(cur, tmp_path):
    mix = build_test_mix(cur, tmp_path, target_tokens=60_000, wide=True)
    r = run_cli("shards", "export", "--format", "megatron", str(mix), "-o", str(tmp_path / "o"),
                "--splits", "train", "--seq-len", "512")
    assert r.returncode == 0, r.stderr
    head = (tmp_path / "o" / "train.idx").read_bytes()[:18]
    assert head[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", head[9:17])[0] == 1
    assert head[17] == 4  # Megatron's DType code of int32
    docs = _read(tmp_path / "o" / "train")
    assert docs[0].dtype == np.int32 and max(int(d.max()) for d in docs) > 65_535
    assert_same_documents(docs, loader_documents(mix, seq_len=512))
    assert not (tmp_path / "o" / "val.bin").exists()
