"""The generated references (docs/configuration.md, docs/manifest-fields.md) match the
pydantic models, every field of tokenmill's input files and manifests says what it means,
and the README stays a short guide."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "docs" / "make_configuration.py"
REGENERATE = f"regenerate it: python {GENERATOR.relative_to(ROOT)} (or make docs)"


def _generator():
    spec = importlib.util.spec_from_file_location("make_configuration", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_references_are_up_to_date() -> None:
    for target, text in _generator().documents().items():
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        assert current == text, f"{target.relative_to(ROOT)} is out of date; {REGENERATE}"


def test_every_config_and_manifest_field_has_a_description() -> None:
    missing = _generator().undescribed_fields()
    assert not missing, ("fields without description= (their meaning in "
                         f"docs/): {', '.join(missing)}; add one, then "
                         f"{REGENERATE}")


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    """``--check`` exits 1 with how to regenerate when the file differs, 0 when it matches."""
    ok = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True,
                        text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT),
                                                                "PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0, ok.stderr
    gen = _generator()
    gen.MANIFEST_TARGET = tmp_path / "manifest-fields.md"
    gen.MANIFEST_TARGET.write_text("stale\n", encoding="utf-8")
    assert gen.main(["--check"]) == 1


def test_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    commands = [ln.split("#")[0].strip() for ln in lines[:8] if ln.startswith("make ")]
    assert commands == ["make run", "make test"], lines[:8]
