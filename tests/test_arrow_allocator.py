"""Every tokenmill process allocates pyarrow's buffers with the C library's malloc (see
``tokenmill._arrow_on_the_system_allocator``), unless the user chose a pool."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.shared import REPO

ASK = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"


@pytest.mark.parametrize("first", ["import tokenmill, pyarrow", "import pyarrow, tokenmill"])
def test_tokenmill_puts_pyarrow_on_the_system_allocator(first):
    """Whether pyarrow was imported before tokenmill (as in a Ray worker) or after."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", f"{first}; {ASK}"], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "system"


def test_a_pool_the_user_chose_is_kept():
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    out = subprocess.run([sys.executable, "-c", f"import tokenmill; {ASK}"], env=env,
                         cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "mimalloc"
