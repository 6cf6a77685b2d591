"""Packaging: what `pip install tokenmill` brings, the train extra, the license."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]

# Run Python with torch and triton unimportable, as after a plain `pip install tokenmill`
_BLOCK = """
import sys
class _NoTrainExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTrainExtra())
"""


def _run_without_torch(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", _BLOCK + code, *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_plain_install_has_no_torch_and_the_train_extra_has_it():
    names = {d.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()
             for d in _project()["dependencies"]}
    assert not names & {"torch", "triton"}
    train = _project()["optional-dependencies"]["train"]
    assert any(d.startswith("torch==") for d in train) and any(d.startswith("triton")
                                                                   for d in train)
    assert any(d.startswith("datasketch>=2.0") for d in _project()["dependencies"])


def test_every_module_outside_the_trainer_imports_without_torch():
    """Curation, manifests and exports, tokenizer tables, n-gram indices and the CLI."""
    r = _run_without_torch(
        "import importlib, pkgutil, tokenmill\n"
        "names = [m.name for m in pkgutil.walk_packages(tokenmill.__path__, 'tokenmill.')\n"
        "         if not m.name.startswith('tokenmill.train.')]\n"
        "for n in names: importlib.import_module(n)\n"
        "assert 'torch' not in sys.modules\n"
        "print(len(names))\n")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 50


def test_train_without_torch_names_the_extra_in_one_line(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text("manifest: mix.json\n")
    r = _run_without_torch("from tokenmill.cli import main\nsys.exit(main(sys.argv[1:]))",
                           "train", str(cfg))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "tokenmill: tokenmill train needs torch and triton (torch is not installed): "
        "pip install 'tokenmill[train]'"]


def test_license_file_and_field():
    assert _project()["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190


def test_lower_bounds_file_pins_every_dependency_at_its_bound():
    """tests/lower_bounds.txt (the install the bounds were checked on) is the bounds."""
    pins = {}
    for line in (REPO / "tests" / "lower_bounds.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    bounds = {}
    for d in _project()["dependencies"]:
        name, version = d.split(">=")
        bounds[name.split("[")[0].lower().replace("_", "-")] = version
    assert set(pins) == set(bounds)
    for name, bound in bounds.items():
        assert Version(pins[name]) == Version(bound), (name, bound, pins[name])
