import os
from pathlib import Path

import pytest

from tests.shared import shared_data_path

# Offline tokenizer files for every test, unless the caller chose a cache already.
_tk = shared_data_path() / "tiktoken"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _tk.exists():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_tk)
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture
def shared_data():
    from tests.shared import shared_data as _sd

    return _sd()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]
