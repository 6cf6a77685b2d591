"""The repository speaks of the product, not of how it was built: no tracked text file
(code, tests, docs, manifests, Makefile) refers to a numbered work item."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The word "issue" followed by a number, or in the possessive: development references. A data
# problem called "an issue" (no number after it) is fine. The character class and this
# wording keep this file from matching itself.
DEVELOPMENT_WORDS = re.compile(r"\bissue \d|\bissue[']s\b|\bissues \d", re.IGNORECASE)


def _tracked_text_files() -> list[Path]:
    """Every file git tracks that reads as UTF-8 text (binary fixtures are skipped)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def test_no_tracked_text_file_refers_to_numbered_work_items() -> None:
    hits = []
    for path in _tracked_text_files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DEVELOPMENT_WORDS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:100]}")
    assert not hits, ("development references; say what the code does instead:\n"
                      + "\n".join(hits))
