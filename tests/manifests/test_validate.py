"""`tokenmill manifest validate` catches a truncated shard, a flipped byte, a missing file."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tokenmill.manifests.validate import validate_manifest


@pytest.fixture
def copy(quickstart, tmp_path):
    src = quickstart.manifest_path.parent
    dst = tmp_path / "run"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("work"))
    shard = dst / quickstart.manifest.shards("train")[0].path
    return dst, shard


def _cli(path):
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "manifest", "validate",
                           str(path)], capture_output=True, text=True)


def test_valid_copy_passes(copy):
    dst, _ = copy
    assert validate_manifest(dst) == []
    assert _cli(dst / "manifest.json").returncode == 0


def test_truncated_shard(copy):
    dst, shard = copy
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    problems = validate_manifest(dst)
    assert problems and str(shard) in problems[0] and "bytes" in problems[0]
    r = _cli(dst)
    assert r.returncode == 1 and shard.name in r.stderr


def test_flipped_byte(copy):
    dst, shard = copy
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = validate_manifest(dst)
    assert len(problems) == 1 and "sha256" in problems[0] and shard.name in problems[0]
    assert _cli(dst).returncode == 1


def test_missing_file(copy):
    dst, shard = copy
    shard.unlink()
    problems = validate_manifest(dst)
    assert len(problems) == 1 and problems[0].startswith(f"{shard}: missing (listed in ")
    r = _cli(dst)
    assert r.returncode == 1 and "missing" in r.stderr
