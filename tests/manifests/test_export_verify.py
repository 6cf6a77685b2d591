"""Every export lists its files and the mix identity; `tokenmill export verify` reads each
format back, and refuses what was changed after the export."""

from __future__ import annotations

import gzip
import json
import shutil
import struct

import pytest

from tests.manifests.exportdata import build_test_mix, run_cli
from tests.manifests.mixdata import cached_test_curations
from tests.shared import corpora
from tokenmill.atomic import sha256_file
from tokenmill.cli import main
from tokenmill.manifests.mixschema import mix_identity_sha256

FORMATS = ("modded-nanogpt", "megatron", "olmo", "hf")


@pytest.fixture(scope="module")
def cur():
    return cached_test_curations(corpora("c4-en-sample").parent)


@pytest.fixture(scope="module")
def exports(cur, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    mix = build_test_mix(cur, tmp, target_tokens=200_000)
    for fmt in FORMATS:  # in this process: `export verify` below is run as a user runs it
        assert main(["shards", "export", "--format", fmt, str(mix), "-o", str(tmp / fmt),
                     "--shard-tokens", "60000"]) == 0
    return mix, tmp


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_every_format_lists_its_files_and_verifies(exports):
    mix, tmp = exports
    streams = []
    for fmt in FORMATS:
        listing = json.loads((tmp / fmt / "export.json").read_text())
        assert listing["format"] == fmt
        assert listing["mix_manifest_sha256"] == mix_identity_sha256(mix)
        on_disk = {p.relative_to(tmp / fmt).as_posix() for p in (tmp / fmt).rglob("*")
                   if p.is_file() and p.name != "export.json"}
        assert {f["path"] for f in listing["files"]} == on_disk
        for f in listing["files"]:
            assert sha256_file(tmp / fmt / f["path"]) == f["sha256"]
        streams.append(listing["streams"])
        r = run_cli("export", "verify", str(tmp / fmt), "--mix", str(mix))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"OK {tmp / fmt}: {fmt} export of mix mix")
    # the same tokens and sequences, whatever the layout
    assert all(s == streams[0] for s in streams)
    assert set(streams[0]) == {"train", "val"}


def test_verify_refuses_a_changed_file(exports, tmp_path):
    _, tmp = exports
    out = _copy(tmp / "megatron", tmp_path / "m")
    data = bytearray((out / "train.bin").read_bytes())
    data[100] ^= 1
    (out / "train.bin").write_bytes(bytes(data))
    r = run_cli("export", "verify", str(out))
    assert r.returncode == 1
    assert f"FAIL {out / 'train.bin'}: sha256 differs" in r.stderr


def test_verify_reads_the_layout_not_only_the_sha256(exports, tmp_path):
    """A file changed together with its listed sha256 is still caught by reading it back:
    a Megatron index whose first sequence is one token longer, an OLMo table missing a row."""
    _, tmp = exports
    out = _copy(tmp / "megatron", tmp_path / "m")
    idx = bytearray((out / "train.idx").read_bytes())
    n0 = struct.unpack("<i", idx[34:38])[0]
    idx[34:38] = struct.pack("<i", n0 + 1)
    (out / "train.idx").write_bytes(bytes(idx))
    _relist(out, "train.idx")
    r = run_cli("export", "verify", str(out))
    assert r.returncode == 1 and "train.idx: sequence pointers" in r.stderr

    out = _copy(tmp / "olmo", tmp_path / "o")
    table = out / "train" / "part-00001.csv.gz"
    rows = gzip.decompress(table.read_bytes()).splitlines(keepends=True)
    table.write_bytes(gzip.compress(b"".join(rows[:-1])))
    _relist(out, "train/part-00001.csv.gz")
    r = run_cli("export", "verify", str(out))
    assert r.returncode == 1 and "part-00001.csv.gz: its start,end,id,src,loc rows" in r.stderr


def _relist(out, rel):
    listing = json.loads((out / "export.json").read_text())
    for f in listing["files"]:
        if f["path"] == rel:
            f["sha256"] = sha256_file(out / rel)
    (out / "export.json").write_text(json.dumps(listing))


def test_verify_against_another_mix_names_it(exports, cur, tmp_path):
    _, tmp = exports
    other = build_test_mix(cur, tmp_path, target_tokens=100_000)
    r = run_cli("export", "verify", str(tmp / "hf"), "--mix", str(other))
    assert r.returncode == 1
    assert "the export was made from another mix" in r.stderr


def test_modded_nanogpt_refuses_a_wide_vocabulary_naming_megatron(cur, tmp_path):
    mix = build_test_mix(cur, tmp_path, target_tokens=20_000, wide=True)
    r = run_cli("shards", "export", "--format", "modded-nanogpt", str(mix), "-o",
                str(tmp_path / "out"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenmill: ")
    assert "cl100k_base" in lines[0] and "--format megatron" in lines[0]
    assert not (tmp_path / "out").exists()


def test_verify_of_a_folder_without_an_export(tmp_path):
    r = run_cli("export", "verify", str(tmp_path))
    assert r.returncode == 2 and r.stderr.startswith("tokenmill: ")
    assert "export.json" in r.stderr and "Traceback" not in r.stderr


def test_exports_are_deterministic_and_a_smaller_one_leaves_no_stale_file(exports, tmp_path):
    """The same export again over a copy of each format's files (in this process: the
    command wrote the originals) gives the same bytes; then a smaller one through the
    command removes the files it no longer writes."""
    from tokenmill.manifests.export import export_mix

    mix, tmp = exports
    for fmt in ("megatron", "olmo", "hf"):
        out = _copy(tmp / fmt, tmp_path / fmt)
        export_mix(mix, out, fmt, shard_tokens=60_000, log=lambda s: None)
        for p in sorted((tmp / fmt).rglob("*")):
            if p.is_file():
                assert (out / p.relative_to(tmp / fmt)).read_bytes() == p.read_bytes(), p
    # fewer, larger files into the same folder: the old parts go, verify finds nothing else
    out = tmp_path / "olmo"
    r = run_cli("shards", "export", "--format", "olmo", str(mix), "-o", str(out))
    assert r.returncode == 0 and "removed" in r.stdout
    assert sorted(p.name for p in (out / "train").iterdir()) == ["part-00000.csv.gz",
                                                                  "part-00000.npy"]
    assert run_cli("export", "verify", str(out), "--mix", str(mix)).returncode == 0


def test_verify_names_an_unlisted_data_file(exports, tmp_path):
    _, tmp = exports
    out = _copy(tmp / "hf", tmp_path / "h")
    shutil.copy(out / "data" / "train-00000.parquet", out / "data" / "train-00099.parquet")
    r = run_cli("export", "verify", str(out))
    assert r.returncode == 1
    assert "train-00099.parquet: not listed in export.json" in r.stderr


def test_a_split_too_small_for_one_row_is_refused_in_one_line(exports, tmp_path):
    mix, _ = exports
    r = run_cli("shards", "export", "--format", "hf", str(mix), "-o", str(tmp_path / "o"),
                "--seq-len", "100000", "--splits", "val")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"tokenmill: {mix}: its val split fills no loader row of 100001 tokens (batch 1): "
        "nothing to export"]
