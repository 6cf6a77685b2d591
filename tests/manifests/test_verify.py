"""The one verified path to a manifest's shards (tokenmill.manifests.verify) and the
``export-stale-shards`` case: stale, truncated or half-written data is refused in one
line naming the file."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.manifests.mixdata import write_texts_curation
from tokenmill.atomic import sha256_file
from tokenmill.manifests.export import export_modded_nanogpt
from tokenmill.manifests.mix import build_mix
from tokenmill.manifests.mixschema import TrainingMixManifest
from tokenmill.manifests.schema import DatamixManifest
from tokenmill.manifests.shards import HEADER_BYTES
from tokenmill.manifests.verify import ShardVerifyError, open_shards, read_manifest
from tokenmill.train.data import MixLoader

CASE = Path(__file__).parent / "cases" / "export-stale-shards"


def _case_texts(folder: Path, edit: bool) -> list[tuple[str, str]]:
    """The case's input (``make_input.py [--edit]``) as (key, text) rows."""
    subprocess.run([sys.executable, "make_input.py", *(["--edit"] if edit else [])],
                   cwd=folder, check=True)
    rows = (folder / "src" / "a.jsonl").read_text().splitlines()
    return [(f"a.jsonl#{i}", json.loads(r)["text"]) for i, r in enumerate(rows)]


def _curate(folder: Path, edit: bool) -> Path:
    """The case's curation (source ``s``, 2,048-token shards, every 10th document val),
    written the way the pipeline writes it: shards, sidecars, manifest.json."""
    texts = _case_texts(folder, edit)
    return write_texts_curation(folder / "out", "export-stale", {"s": texts}, val_every=10,
                                max_shard_tokens=2048)


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    """The case folder after: curate, ``mix build``, edit the input, curate again."""
    tmp = tmp_path_factory.mktemp("stale") / "case"
    shutil.copytree(CASE, tmp)
    _curate(tmp, edit=False)
    build_mix(tmp / "spec.yaml", tmp / "mix.json")
    _curate(tmp, edit=True)
    return tmp


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_export_refuses_stale_shards_naming_them(case, tmp_path):
    m = json.loads((case / "mix.json").read_text())
    listed = [sh for s in m["sources"] for sh in s["shards"] + s["val_shards"]]
    stale = [sh["path"] for sh in listed if sha256_file(case / sh["path"]) != sh["sha256"]]
    assert len(stale) >= 2  # the edit changed the token ids, not the counts
    with pytest.raises(ShardVerifyError) as e:
        export_modded_nanogpt(case / "mix.json", tmp_path / "exp", log=lambda s: None)
    msg = _one_line(e)
    assert msg.startswith(str((case / stale[0]).resolve()))
    assert "sha256" in msg and f"{len(stale) - 1} more file(s) differ" in msg
    for p in stale[1:9]:
        assert Path(p).name in msg
    assert not (tmp_path / "exp").exists()  # refused before writing anything
    # the loader and mix build refuse the same data the same way
    with pytest.raises(ShardVerifyError, match="sha256"):
        MixLoader(case / "mix.json", seq_len=64, batch_size=2)
    # an explicit opt-out reads it (its shapes still match)
    export_modded_nanogpt(case / "mix.json", tmp_path / "exp", log=lambda s: None,
                          verify=False, seq_len=64)
    assert (tmp_path / "exp" / "fineweb_train_000001.bin").exists()


def test_cli_refuses_and_no_verify_says_so(case, tmp_path, capsys):
    from tokenmill.manifests.mix_commands import NO_VERIFY_LINE, add_mix_commands

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    shards = sub.add_parser("shards").add_subparsers(dest="shards_command")
    add_mix_commands(sub, shards)
    args = parser.parse_args(["shards", "export", str(case / "mix.json"), "--format",
                              "modded-nanogpt", "-o", str(tmp_path / "e"), "--seq-len", "64"])
    with pytest.raises(ShardVerifyError):
        args.func(args)
    args = parser.parse_args(["shards", "export", str(case / "mix.json"), "--format",
                              "modded-nanogpt", "-o", str(tmp_path / "e"), "--seq-len", "64",
                              "--no-verify"])
    assert args.func(args) == 0
    assert NO_VERIFY_LINE in capsys.readouterr().err
    args = parser.parse_args(["mix", "build", str(case / "spec.yaml"), "-o",
                              str(tmp_path / "m.json"), "--no-verify"])
    assert args.func(args) == 0
    assert NO_VERIFY_LINE in capsys.readouterr().err


@pytest.fixture
def curation(tmp_path) -> Path:
    shutil.copytree(CASE, tmp_path / "c")
    return _curate(tmp_path / "c", edit=False)


def test_half_written_folder_is_refused(curation):
    folder = curation.parent
    opened = open_shards(folder, "train")
    assert opened.verified and len(opened.shards) >= 2
    assert all(s.path.is_file() and s.entry.split == "train" for s in opened.shards)
    # a shard cut short (a run killed while writing it): refused even without sha256
    victim = opened.shards[1].path
    data = victim.read_bytes()
    victim.write_bytes(data[: HEADER_BYTES + (len(data) - HEADER_BYTES) // 2])
    for verify in (True, False):
        with pytest.raises(ShardVerifyError) as e:
            open_shards(folder, "train", verify=verify)
        assert _one_line(e).startswith(str(victim)) and "truncated" in str(e.value)
    # a sidecar missing
    victim.write_bytes(data)
    open_shards(folder, "train")
    side = opened.shards[0].sidecar
    side.unlink()
    with pytest.raises(ShardVerifyError) as e:
        open_shards(folder, None)
    assert _one_line(e).startswith(str(side)) and "missing" in str(e.value)
    # the manifest not yet written
    curation.unlink()
    with pytest.raises(ShardVerifyError) as e:
        open_shards(folder, "train")
    assert _one_line(e).startswith(str(folder)) and "half-written" in str(e.value)
    with pytest.raises(ShardVerifyError, match="manifest.json: not found"):
        MixLoader.from_curation(curation, seq_len=64, batch_size=2)


def test_kind_is_named_and_bad_json_is_one_line(curation, tmp_path):
    spec = yaml.safe_load((CASE / "spec.yaml").read_text())
    spec["manifests"] = [str(curation)]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    build_mix(tmp_path / "s.yaml", tmp_path / "mix.json")
    with pytest.raises(ShardVerifyError) as e:
        open_shards(curation, kind="training-mix")
    assert "this is a curation manifest" in _one_line(e)
    with pytest.raises(ShardVerifyError) as e:
        open_shards(tmp_path / "mix.json", kind="curation")
    assert "this is a training-mix manifest" in _one_line(e)
    with pytest.raises(ShardVerifyError, match="curation manifest"):
        MixLoader(curation, seq_len=64, batch_size=2)
    with pytest.raises(ShardVerifyError, match="training-mix manifest"):
        export_modded_nanogpt(curation, tmp_path / "x")
    opened = open_shards(tmp_path / "mix.json", None, kind="training-mix")
    assert {s.entry.split for s in opened.shards} == {"train", "val"}
    bad = json.loads(curation.read_text())
    bad["sources"][0]["shards"][0]["tokens"] = "many"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ShardVerifyError) as e:
        open_shards(tmp_path / "bad.json")
    assert "sources.0.shards.0.tokens" in _one_line(e)
    (tmp_path / "trunc.json").write_text(curation.read_text()[:100])
    with pytest.raises(ShardVerifyError, match="not a JSON manifest"):
        open_shards(tmp_path / "trunc.json")


def test_either_kind_is_read_as_the_kind_the_file_says(curation, tmp_path):
    """``kind=None`` (the trainer's ``data:``): the file is read as the kind it records; a
    file of neither kind is refused as a curation manifest would refuse it."""
    spec = yaml.safe_load((CASE / "spec.yaml").read_text())
    spec["manifests"] = [str(curation)]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    build_mix(tmp_path / "s.yaml", tmp_path / "mix.json")
    assert isinstance(read_manifest(curation.parent, None)[1], DatamixManifest)
    path, mix = read_manifest(tmp_path / "mix.json", None)
    assert path == tmp_path / "mix.json" and isinstance(mix, TrainingMixManifest)
    (tmp_path / "export.json").write_text(json.dumps({"format": "modded-nanogpt",
                                                      "files": []}))
    with pytest.raises(ShardVerifyError) as e:
        read_manifest(tmp_path / "export.json", None)
    assert "this is a modded-nanogpt export's export.json" in _one_line(e)
    assert "a curation manifest" in str(e.value)
    old = json.loads((tmp_path / "mix.json").read_text())
    old["schema_version"] = 0
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ShardVerifyError, match="training-mix manifest schema_version 0"):
        read_manifest(tmp_path / "old.json", None)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ShardVerifyError, match="not a manifest .a JSON list"):
        read_manifest(tmp_path / "list.json", None)


def test_mix_build_refuses_a_changed_curation_shard(curation, tmp_path):
    opened = open_shards(curation, "val")
    p = opened.shards[0].path
    a = np.fromfile(p, dtype="<u2", offset=HEADER_BYTES)
    a[-1] ^= 1  # one token id flipped, same size and header
    p.write_bytes(p.read_bytes()[:HEADER_BYTES] + a.tobytes())
    spec = yaml.safe_load((CASE / "spec.yaml").read_text())
    spec["manifests"] = [str(curation)]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ShardVerifyError) as e:
        build_mix(tmp_path / "s.yaml", tmp_path / "mix.json")
    assert _one_line(e).startswith(str(p))
    assert not (tmp_path / "mix.json").exists()
    build_mix(tmp_path / "s.yaml", tmp_path / "mix.json", verify=False)


@pytest.mark.slow
def test_export_stale_shards_case_end_to_end(tmp_path):
    """The case as its README tells it: `tokenmill run` twice around an edit (the real
    pipeline), `mix build` in between, then export: refused, naming the stale shards."""
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.run.executor import run_datamix

    folder = tmp_path / "case"
    shutil.copytree(CASE, folder)

    def curate(edit: bool) -> None:
        _case_texts(folder, edit)
        cfg = load_datamix(folder / "mix.yaml", data_root=str(folder),
                           output_dir=str(folder / "out"))
        run_datamix(cfg, num_cpus=1, progress=False)

    curate(edit=False)
    build_mix(folder / "spec.yaml", folder / "mix.json")
    curate(edit=True)
    m = json.loads((folder / "mix.json").read_text())
    stale = [sh["path"] for s in m["sources"] for sh in s["shards"] + s["val_shards"]
             if sha256_file(folder / sh["path"]) != sh["sha256"]]
    assert stale
    with pytest.raises(ShardVerifyError) as e:
        export_modded_nanogpt(folder / "mix.json", folder / "exp", log=lambda s: None)
    msg = _one_line(e)
    assert Path(stale[0]).name in msg and "sha256" in msg
    assert not (folder / "exp").exists()
