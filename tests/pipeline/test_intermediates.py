"""Intermediates are verified on read: a flipped byte is detected and recomputed."""

from __future__ import annotations

import logging

from tests.shared import corpora
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.run.executor import run_datamix


def _cfg(tmp_path):
    return DatamixConfig(name="t", data_root=str(corpora()), output_dir=str(tmp_path / "out"),
                         sources=[{"name": "c4", "path": "c4-en-sample", "max_documents": 300},
                                  {"name": "books", "path": "books-public-domain",
                                   "max_documents": 1}])


def test_flipped_byte_in_intermediate_is_recomputed(tmp_path, caplog):
    first = run_datamix(_cfg(tmp_path), num_cpus=1, progress=False)
    manifest = first.manifest_path.read_bytes()
    victim = sorted((tmp_path / "out" / "work" / "tokenize").glob("*.tokens.parquet"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    # run the check in this process so that the warning is captured
    from tokenmill.pipeline.run.intermediate import StageOutput

    digest = victim.name.split(".")[0]
    with caplog.at_level(logging.WARNING):
        assert StageOutput(tmp_path / "out" / "work", "tokenize", digest).load_done() is None
    assert str(victim) in caplog.text and "checksum" in caplog.text
    second = run_datamix(_cfg(tmp_path), num_cpus=1, progress=False)
    assert second.reused_units == second.total_units - 1
    assert second.manifest_path.read_bytes() == manifest
    assert victim.read_bytes() != bytes(data)
