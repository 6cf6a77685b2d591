"""`tokenmill shards inspect` decodes by default and says which tokenizer and why: the one
the curation manifest records, else the one the header's version implies; it warns when
the tokenizer cannot have made the shard."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.manifests.mixdata import write_texts_curation
from tests.shared import shared_data
from tokenmill.manifests.shards import sidecar_path, write_shard
from tokenmill.manifests.validate import inspect_shard
from tokenmill.tokenizers import get_encoding

TEXTS = [("a#0", "The quick brown fox jumps over the lazy dog."),
         ("a#1", "Ein Käsebrot und ein Glas Milch, bitte."),
         ("a#2", "Third document: tokens, shards and sidecars.")]


@pytest.fixture(scope="module", autouse=True)
def _tiktoken():
    shared_data("tiktoken")  # skip without the offline tokenizer files


def _loose_shard(path: Path, encoding: str, texts=TEXTS, eot: bool = True,
                 version: int | None = None) -> Path:
    """A shard of ``texts`` in ``encoding`` (EOT before each unless ``eot`` is False),
    with its sidecar, and no manifest around it."""
    enc = get_encoding(encoding)
    parts, offs, pos = [], [], 0
    for _, t in texts:
        ids = ([enc.eot_token] if eot else []) + enc.encode_ordinary(t)
        parts.append(np.array(ids, np.int64))
        offs.append(pos)
        pos += len(ids)
    v = version or (1 if enc.n_vocab <= 1 << 16 else 2)
    write_shard(path, np.concatenate(parts), v, np.array(offs, np.uint64),
                [k for k, _ in texts])
    return path


def test_tokenizer_from_the_curation_manifest(tmp_path):
    man = write_texts_curation(tmp_path / "cur", "cur", {"s": TEXTS}, encoding="cl100k_base",
                               val_every=100)
    shard = next((man.parent / "shards").rglob("train_*.bin"))
    out = inspect_shard(shard)
    assert f"tokenizer  cl100k_base (from the curation manifest {man})" in out
    assert "version 2 = uint32 tokens" in out and "EOT        3 tokens (id 100,257)" in out
    assert "The quick brown fox" in out and "Ein Käsebrot" in out  # decoded by default
    assert "WARNING" not in out
    # given a tokenizer other than the manifest's: warned, and why it cannot match
    out = inspect_shard(shard, tokenizer="gpt2")
    assert f"WARNING: the curation manifest {man} says cl100k_base, not gpt2" in out
    assert "WARNING: token ids up to 100,257, but gpt2 has 50,257 ids" in out
    assert "WARNING: no EOT token (gpt2's is 50,256)" in out
    assert "not decoded" in out and "quick brown" not in out


def test_v1_without_manifest_or_sidecar_is_gpt2(tmp_path):
    shard = _loose_shard(tmp_path / "x.bin", "gpt2")
    sidecar_path(shard).unlink()
    out = inspect_shard(shard, docs=2)
    assert "tokenizer  gpt2 (header version 1 = uint16 tokens, modded-nanogpt's" in out
    assert "no sidecar" in out and "split at EOT" in out
    assert "The quick brown fox" in out and "Ein Käsebrot" in out
    assert "Third document" not in out  # --docs 2
    assert "WARNING" not in out


@pytest.mark.parametrize("encoding,eot", [("cl100k_base", "100,257"), ("o200k_base", "199,999")])
def test_v2_without_manifest_picks_the_encoding_by_its_eot(tmp_path, encoding, eot):
    shard = _loose_shard(tmp_path / "x.bin", encoding)
    out = inspect_shard(shard)
    assert f"tokenizer  {encoding} (header version 2 = uint32 tokens" in out
    assert f"the first token {eot} is {encoding}'s EOT" in out
    assert "The quick brown fox" in out and "WARNING" not in out


def test_tokenizer_that_cannot_match_is_warned(tmp_path):
    # gpt2 tokens read as cl100k_base: ids in range, but no EOT and the wrong version
    shard = _loose_shard(tmp_path / "g.bin", "gpt2")
    out = inspect_shard(shard, tokenizer="cl100k_base")
    assert "WARNING: no EOT token (cl100k_base's is 100,257)" in out
    assert "WARNING: header version 1 (uint16), but cl100k_base (100,277 ids) is written " \
           "as version 2" in out
    assert "WARNING: 3 of 3 documents (sidecar offsets) do not start with" in out
    # a shard without any EOT: the implied gpt2 is warned about too
    bare = _loose_shard(tmp_path / "bare.bin", "gpt2", eot=False)
    out = inspect_shard(bare)
    assert "tokenizer  gpt2 (header version 1" in out
    assert "WARNING: no EOT token (gpt2's is 50,256)" in out


def test_export_json_names_the_tokenizer(tmp_path):
    shard = _loose_shard(tmp_path / "fineweb_train_000001.bin", "gpt2")
    (tmp_path / "export.json").write_text('{"format": "modded-nanogpt", "files": [], '
                                          '"tokenizer": {"name": "r50k_base"}}')
    out = inspect_shard(shard)
    assert f"tokenizer  r50k_base (from the export's {tmp_path / 'export.json'})" in out


def test_undecodable_bytes_are_escaped_not_replaced(tmp_path):
    enc = get_encoding("gpt2")
    frag = enc.encode_single_token(b"\xe6")  # a byte-fragment token (first byte of 我)
    shard = tmp_path / "f.bin"
    write_shard(shard, np.array([enc.eot_token, *enc.encode_ordinary("ok "), frag]), 1,
                np.array([0], np.uint64), ["f#0"])
    out = inspect_shard(shard)
    assert "ok \\xe6" in out and "\ufffd" not in out


def test_cli_inspect(tmp_path, capsys):
    from tokenmill.cli import main

    shard = _loose_shard(tmp_path / "x.bin", "gpt2")
    shutil.copy(shard, tmp_path / "y.bin")  # no sidecar
    assert main(["shards", "inspect", str(tmp_path / "y.bin"), "--docs", "1"]) == 0
    out = capsys.readouterr().out
    assert "tokenizer  gpt2" in out and "The quick brown fox" in out
    assert main(["shards", "inspect", str(shard), "--tokenizer", "cl100k_base"]) == 0
    assert "WARNING: no EOT token" in capsys.readouterr().out


def test_cli_inspect_takes_a_tokenizer_file(tmp_path):
    """``--tokenizer`` names a tokenizer table file (not only a built-in name): a shard
    made with it decodes to its text through the command."""
    import os
    import subprocess
    import sys

    from tests.tokenizers.tokenizer_files import RENUMBERED, write_renumbered
    from tokenmill.tokenizers.arguments import tokenizer_arg

    write_renumbered(tmp_path / "tok")
    table = str(tmp_path / "tok" / "tokenizer.yaml")
    shard = _loose_shard(tmp_path / "x.bin", tokenizer_arg(table))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "tokenmill.cli", "shards", "inspect",
                           str(shard), "--tokenizer", table, "--docs", "1"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert f"tokenizer  {RENUMBERED} (given with --tokenizer)" in done.stdout
    assert "The quick brown fox" in done.stdout and "WARNING" not in done.stdout
