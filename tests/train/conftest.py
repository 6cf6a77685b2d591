from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's small ops (used with ``pytest.mark.usefixtures``):
    on 2 shared cores torch's 2 OpenMP threads slow them down ~30x under contention."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
