"""Checkpoints load with ``weights_only=True``: what is not a tensor round-trips as plain
values, and a checkpoint that would run code when unpickled is refused in one line."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from tokenmill.train.checkpoint import load_checkpoint, save_checkpoint


def test_numpy_state_round_trips(tmp_path):
    np.random.seed(3)
    state = {"rng_numpy": np.random.get_state(), "w": torch.arange(4.0),
             "hist": [(1, np.float32(2.5))], "big_endian": np.arange(6, dtype=">i4").reshape(2, 3)}
    got = load_checkpoint(save_checkpoint(tmp_path, 1, state), torch.device("cpu"))
    np.random.set_state(got["rng_numpy"])
    assert np.random.randint(1 << 30) == (np.random.seed(3), np.random.randint(1 << 30))[1]
    assert got["hist"] == [(1, 2.5)] and got["big_endian"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert torch.equal(got["w"], state["w"])


class _Planted:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


@pytest.mark.parametrize("payload", [
    lambda p: p.write_bytes(pickle.dumps({"model": _Planted(), "step": 1})),
    lambda p: torch.save({"model": _Planted()}, p),
    lambda p: torch.save({"rng": np.zeros(3)}, p),  # an older checkpoint's numpy pickle
    lambda p: p.write_bytes(b"not a checkpoint"),
])
def test_a_checkpoint_needing_code_to_load_is_refused(tmp_path, monkeypatch, payload):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "step_0000001.pt"
    payload(path)
    with pytest.raises(ValueError) as e:
        load_checkpoint(path, torch.device("cpu"))
    assert str(path) in str(e.value) and "refused" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "PWNED").exists()
