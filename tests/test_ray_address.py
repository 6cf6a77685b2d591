"""Which Ray a command uses: ``--ray-address`` / ``TOKENMILL_RAY_ADDRESS``, else
``RAY_ADDRESS`` (as ``ray job submit`` sets it), else an embedded local Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokenmill.raysession import ray_address


@pytest.mark.parametrize(("arg", "env", "expect"), [
    (None, {}, None),
    ("10.0.0.1:6379", {"RAY_ADDRESS": "10.0.0.2:6379"}, "10.0.0.1:6379"),
    (None, {"TOKENMILL_RAY_ADDRESS": "auto", "RAY_ADDRESS": "10.0.0.2:6379"}, "auto"),
    (None, {"RAY_ADDRESS": "10.0.0.2:6379"}, "10.0.0.2:6379"),
    ("auto", {}, "auto"),
    (None, {"RAY_ADDRESS": ""}, None),
])
def test_ray_address_order(monkeypatch, arg, env, expect):
    for name in ("RAY_ADDRESS", "TOKENMILL_RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert ray_address(arg) == expect


def test_a_dashboard_url_is_refused_in_one_line(tmp_path, repo_root):
    """RAY_ADDRESS=http://HEAD:8265 is what the job CLI takes; a driver cannot join it."""
    from tests.shared import corpora

    mix = tmp_path / "mix.yaml"
    mix.write_text(f"name: t\ntokenizer: gpt2\ndata_root: {corpora()}\n"
                   "licenses: {allow: [odc-by]}\nsources:\n"
                   "  - {name: c4, path: c4-en-sample, max_documents: 10}\n")
    env = dict(os.environ, RAY_ADDRESS="http://127.0.0.1:8265")
    env.pop("TOKENMILL_RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q",
                        "-o", str(tmp_path / "out")], capture_output=True, text=True,
                       env=env, cwd=repo_root, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "tokenmill: RAY_ADDRESS=http://127.0.0.1:8265 is a Ray dashboard (job API) address; "
        "a driver joins a cluster by HOST:PORT of its GCS or 'auto' (or submit the command "
        "with `ray job submit`)")
    assert not (tmp_path / "out" / "manifest.json").exists()
