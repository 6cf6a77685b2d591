"""`tokenmill shards export --format hf`, loaded offline with `datasets.load_dataset`."""

from __future__ import annotations

import os
import subprocess
import sys

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

# load_dataset(DIR) with the Hub unreachable by configuration, in a fresh process (datasets
# reads its offline switches when imported); the rows come back as an .npz
_LOAD = """
import sys, numpy as np, datasets
ds = datasets.load_dataset(sys.argv[1], cache_dir=sys.argv[2])
out = {}
for split in ds:
    rows = ds[split]["input_ids"]
    out[split + "_tokens"] = np.concatenate([np.asarray(r, np.int64) for r in rows])
    out[split + "_lengths"] = np.array([len(r) for r in rows], np.int64)
    out[split + "_sources"] = np.array(ds[split]["source"])
np.savez(sys.argv[3], **out)
"""


def _load(folder, tmp) -> dict[str, list[np.ndarray]]:
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf-home")}
    r = subprocess.run([sys.executable, "-c", _LOAD, str(folder), str(tmp / "hf-cache"),
                        str(tmp / "rows.npz")], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    z = np.load(tmp / "rows.npz")
    splits = sorted({k.rsplit("_", 1)[0] for k in z.files})
    out = {s: np.split(z[f"{s}_tokens"], np.cumsum(z[f"{s}_lengths"])[:-1]) for s in splits}
    out.update({f"{s}_sources": list(z[f"{s}_sources"]) for s in splits})
    return out


@pytest.fixture(scope="module")
def cur():
    return cached_test_curations(corpora("c4-en-sample").parent)


@pytest.fixture(scope="module")
def mix(cur, tmp_path_factory):
    return build_test_mix(cur, tmp_path_factory.mktemp("hf"))


def test_hf_dataset_holds_the_loaders_documents(mix, tmp_path):
    r = run_cli("shards", "export", "--format", "hf", str(mix), "-o", str(tmp_path / "out"),
                "--shard-tokens", "150000")
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "out" / "data").glob("train-*.parquet"))) >= 3
    card = (tmp_path / "out" / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n") and "path: data/validation-*.parquet" in card
    got = _load(tmp_path / "out", tmp_path)
    assert_same_documents(got["train"], loader_documents(mix))
    assert_same_documents(got["validation"], val_documents(mix))
    assert set(got["train_sources"]) == {"c4", "wiki", "py"}


def test_hf_packed_rows_are_the_loaders_rows(mix, tmp_path):
    r = run_cli("shards", "export", "--format", "hf", str(mix), "-o", str(tmp_path / "out"),
                "--seq-len", "256", "--batch-size", "4")
    assert r.returncode == 0, r.stderr
    got = _load(tmp_path / "out", tmp_path)
    np.testing.assert_array_equal(np.stack(got["train"]),
                                  loader_rows(mix, "train", seq_len=256, batch_size=4))
    np.testing.assert_array_equal(np.stack(got["validation"]),
                                  loader_rows(mix, "val", seq_len=256, batch_size=4))
