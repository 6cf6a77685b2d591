"""A YAML file that names a key twice is refused by every command that reads one, in one
line naming the file and both lines (PyYAML alone would keep the last value silently)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATAMIX = "name: x\ntokenizer: gpt2\nname: y\nsources: [{name: a, path: a, license: mit}]\n"


@pytest.mark.parametrize("argv, text", [
    (["run", "{f}", "-o", "{tmp}/out"], DATAMIX),
    (["mix", "build", "{f}", "-o", "{tmp}/mix.json"], DATAMIX),
    (["train", "{f}", "-o", "{tmp}/run"], "data: a\nsteps: 3\nname: y\nsteps: 4\n"),
])
def test_a_key_named_twice_is_one_line_through_the_command(tmp_path: Path, argv: list[str],
                                                            text: str) -> None:
    spec = tmp_path / "twice.yaml"
    spec.write_text(text)
    args = [a.format(f=spec, tmp=tmp_path) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and str(spec) in line, line
    assert "appears twice (lines 1 and 3)" in line or "appears twice (lines 2 and 4)" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()
