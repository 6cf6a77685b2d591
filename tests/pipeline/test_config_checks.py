"""Config values that cannot work are refused when the datamix is read, before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenmill.manifests.shards import ShardError, read_header
from tokenmill.pipeline.config import load_datamix

BASE = "name: x\ntokenizer: gpt2\nsources: [{name: a, path: a, license: mit}]\n"


@pytest.mark.parametrize("extra, field", [
    ("fuzzy_dedup: {threshold: 1.5}", "fuzzy_dedup.threshold"),
    ("fuzzy_dedup: {ngram: 0}", "fuzzy_dedup.ngram"),
    ("fuzzy_dedup: {num_perm: 0}", "fuzzy_dedup.num_perm"),
    ("filters: {min_chars: -1}", "filters.min_chars"),
    ("filters: {min_chars: 100, max_chars: 10}", "min_chars 100 > max_chars 10"),
    ("language: {min_score: 2}", "language.min_score"),
    # a value of another type is refused, not converted (`true` is not 1, "50" not 50)
    ("decontamination: {eval_sets: [{name: e, path: e.jsonl}], n: true}",
     "decontamination.n"),
    ("substring_dedup: {min_tokens: '50'}", "substring_dedup.min_tokens"),
    ("fuzzy_dedup: {num_perm: 128.0}", "fuzzy_dedup.num_perm"),
])
def test_impossible_values_are_refused_on_read(tmp_path: Path, extra: str, field: str) -> None:
    spec = tmp_path / "mix.yaml"
    spec.write_text(BASE + extra + "\n")
    with pytest.raises(ValueError) as e:
        load_datamix(spec, data_root=str(tmp_path))
    assert str(spec) in str(e.value)
    assert field in str(e.value) or field.split(".")[-1] in str(e.value)


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntokenizer: gpt2\nsources: [\n")
    with pytest.raises(ValueError) as e:
        load_datamix(spec)
    msg = str(e.value)
    assert msg.startswith(f"{spec}: line 4, column 1: invalid YAML") and "\n" not in msg


def test_a_file_that_is_not_a_shard_says_so(tmp_path: Path) -> None:
    path = tmp_path / "mask.bin"
    np.array([1162628436] + [0] * 255, np.int32).tofile(path)
    with pytest.raises(ShardError, match=r"not a token shard: .* magic number 20240520"):
        read_header(path)


def test_a_value_of_another_type_through_the_command(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    spec = tmp_path / "mix.yaml"
    spec.write_text(BASE + "substring_dedup: {min_tokens: true}\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(spec), "-o",
                           str(tmp_path / "out"), "--data-root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "substring_dedup.min_tokens: expected a valid integer, got True" in done.stderr


def test_fields_outside_the_identity_are_marked_once_and_left_out_everywhere():
    """The fields that do not change what a run writes carry one marker on the model: the
    config's identity (``config_sha256``) leaves each out, a field without it counts, and
    the substring stage's fingerprint leaves out the same fields of its section; the
    configuration reference says so."""
    from tokenmill.pipeline.config import (
        DatamixConfig,
        SubstringDedupConfig,
        outside_identity,
    )
    from tokenmill.pipeline.dedup.substring import SubstringDedup

    assert outside_identity(DatamixConfig) == (
        "data_root", "output_dir", "dedup", "files_per_block", "block_documents", "write_text")
    assert SubstringDedup.how_cut == outside_identity(SubstringDedupConfig) == ("part_tokens",)
    base = {"name": "x", "sources": [{"name": "s", "path": "s"}], "substring_dedup": {}}
    ref = DatamixConfig.model_validate(base)
    changed = {"data_root": "/elsewhere", "output_dir": "/o", "files_per_block": 3,
               "block_documents": 7, "write_text": True, "dedup": {"partitions": 3},
               "substring_dedup": {"part_tokens": 99}}
    for key, value in changed.items():
        other = DatamixConfig.model_validate(base | {key: value})
        assert other.sha256() == ref.sha256(), key
    for key, value in {"max_document_bytes": 5, "substring_dedup": {"min_tokens": 9}}.items():
        assert DatamixConfig.model_validate(base | {key: value}).sha256() != ref.sha256(), key
    reference = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| `part_tokens`"))
    assert "not part of the config's identity" in row
