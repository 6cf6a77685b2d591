"""The one helper through which tests find ``../shared/data``.

Tests that need real corpora call :func:`shared_data` (or use the ``shared_data``
fixture). Without the folder they skip with a clear reason, unless
``TOKENMILL_REQUIRE_SHARED=1`` (set by ``.ci/run``), in which case they fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_path() -> Path:
    return Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_data(*parts: str) -> Path:
    """Path under ``../shared/data``; skips (or fails when required) if absent."""
    p = shared_data_path().joinpath(*parts)
    if not p.exists():
        msg = f"real data not found at {p} (../shared/data beside the checkout)"
        if os.environ.get("TOKENMILL_REQUIRE_SHARED") == "1":
            pytest.fail(msg + " but TOKENMILL_REQUIRE_SHARED=1")
        pytest.skip(msg)
    return p


def corpora(*parts: str) -> Path:
    return shared_data("corpora", *parts)
