"""Same datamix, 1 vs 2 Ray CPUs: byte-identical shards, sidecars, quarantine and manifest."""

from __future__ import annotations

import pytest

from tests.conftest import final_files, run_quickstart_like


@pytest.mark.slow  # a second quickstart run; partition counts: test_dedup_partitioned
def test_one_and_two_cpus_give_identical_bytes(quickstart, tmp_path):
    one = run_quickstart_like(tmp_path / "one", num_cpus=1)
    a = final_files(quickstart.manifest_path.parent)
    b = final_files(one.manifest_path.parent)
    assert sorted(a) == sorted(b)
    assert any(k.endswith(".bin") for k in a) and any(k.endswith(".docs.parquet") for k in a)
    for k in a:
        assert a[k] == b[k], f"{k} differs between 1 and 2 Ray CPUs"
