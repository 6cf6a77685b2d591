"""Running a case of ``tests/pipeline/cases`` the way a user does: ``tokenmill ...`` as a
subprocess from a copy of the case's folder, and reading its outputs with the case's own
independent checker (``verify.py``: numpy + tiktoken, no tokenmill code)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).parent / "cases"


def case_copy(tmp_path: Path, case: str) -> Path:
    """A writable copy of the case's folder under ``tmp_path``."""
    dst = tmp_path / case
    shutil.copytree(CASES / case, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    return dst


def env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: the datamix's own ``data_root`` (no
    ``TOKENMILL_DATA_ROOT``), this checkout importable after any ``PYTHONPATH`` given."""
    e = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DATA_ROOT"}
    first = extra.pop("PYTHONPATH", "")
    e["PYTHONPATH"] = os.pathsep.join(p for p in (first, str(REPO)) if p)
    e.update(extra)
    return e


def tm(cwd: Path, *args: str, timeout: float = 900, **extra: str
       ) -> subprocess.CompletedProcess:
    """``tokenmill ARGS`` in ``cwd``; output captured as text."""
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], cwd=cwd,
                          env=env(**extra), capture_output=True, text=True, timeout=timeout)


def py(cwd: Path, script: str, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """``python3 SCRIPT ARGS`` of the case (its make_input.py, plant.py, ...) in ``cwd``."""
    r = subprocess.run([sys.executable, script, *args], cwd=cwd, env=env(**extra),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def run_case(folder: Path, mix: str = "mix.yaml", out: str = "out", *flags: str
             ) -> subprocess.CompletedProcess:
    """``tokenmill run MIX -o OUT --num-cpus 1 -q`` (the README's command)."""
    return tm(folder, "run", mix, "-o", out, "--num-cpus", "1", "-q", *flags)


def one_line(stderr: str) -> str:
    """The only line of ``stderr`` (asserting there is exactly one, no traceback)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def checker_load(out: Path) -> tuple[dict, dict[str, str], list[dict]]:
    """(manifest, decoded documents by key, quarantine rows) by the cases' ``verify.py``."""
    spec = importlib.util.spec_from_file_location("case_verify",
                                                  CASES / "zst-trunc" / "verify.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.load(str(out))
