"""A side-channel command re-run into the same ``-o`` folder with fewer shards leaves exactly
its own files (``tokenmill ngram lem`` / ``tokenmill ngram features``): no shard of the
earlier run is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shared import corpora
from tokenmill.cli import main
from tokenmill.manifests.mixschema import load_mix_manifest


@pytest.fixture(scope="module")
def tiny_mix(tmp_path_factory) -> Path:
    """A two-source training mix (c4 + wikipedia, gpt2) of about 60,000 tokens."""
    from tests.manifests.mixdata import cached_test_curations, write_spec
    from tokenmill.manifests.mix import build_mix

    cur = cached_test_curations(corpora("c4-en-sample").parent)
    tmp = tmp_path_factory.mktemp("rerun_mix")
    sources = {"c4": {"source": "c4-en-sample", "weight": 0.6, "max_epochs": 3},
               "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.4, "max_epochs": 3}}
    spec = write_spec(tmp / "mix.yaml", [cur["web"], cur["ref"]], sources, 60_000)
    build_mix(spec, tmp / "mix.json")
    return tmp / "mix.json"


@pytest.mark.parametrize(("command", "meta_name", "keys", "extra"), [
    ("lem", "lem.json", ("len", "next"), ["--window", "65536", "-k", "2"]),
    ("features", "ngram.json", ("cand", "logp"), ["-m", "2", "--orders", "2-3", "-q"]),
])
def test_rerun_with_fewer_shards_leaves_only_its_files(tiny_mix, tmp_path, command,
                                                       meta_name, keys, extra):
    out = tmp_path / "side"
    args = ["ngram", command, str(tiny_mix), "-o", str(out), "--seq-len", "64",
            "--batch-size", "2", *extra]
    assert main([*args, "--shard-tokens", "7000"]) == 0
    many = json.loads((out / meta_name).read_text())["files"]
    assert len(many) > 2
    (out / "notes.txt").write_text("mine")  # not a shard: kept
    assert main([*args, "--shard-tokens", "1000000"]) == 0
    files = json.loads((out / meta_name).read_text())["files"]
    assert len(files) == 1
    want = {meta_name, "notes.txt", *(f[k] for f in files for k in keys)}
    assert {p.name for p in out.iterdir()} == want
    (ref,) = [r for r in load_mix_manifest(tiny_mix).side_channels
              if (tiny_mix.parent / r.path).resolve() == (out / meta_name).resolve()]
    assert len(ref.files) == len(keys)
