"""The prefix auxiliary loss's weight schedule: constant, or the speedrun's
linear anneal from the start weight to 0 over the run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenmill.train.config import TrainConfig, TrainConfigError
from tokenmill.train.targets import TokenTables
from tokenmill.train.train import Run, prefix_aux_weight_at


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(data="unused", steps=100, **kw)


def test_default_is_off_and_constant() -> None:
    cfg = _cfg()
    assert cfg.prefix_aux_weight == 0.0 and cfg.prefix_aux_schedule == "constant"
    assert prefix_aux_weight_at(0, cfg) == 0.0


def test_constant_weight_every_step() -> None:
    cfg = _cfg(prefix_aux_weight=0.3)
    assert [prefix_aux_weight_at(s, cfg) for s in (0, 50, 99)] == [0.3, 0.3, 0.3]


def test_anneal_is_linear_from_start_weight_to_zero() -> None:
    cfg = _cfg(prefix_aux_weight=0.25, prefix_aux_schedule="anneal")
    assert prefix_aux_weight_at(0, cfg) == pytest.approx(0.25)
    assert prefix_aux_weight_at(50, cfg) == pytest.approx(0.125)
    assert prefix_aux_weight_at(99, cfg) == pytest.approx(0.0025)
    assert prefix_aux_weight_at(100, cfg) == 0.0  # never negative, even past the end
    assert prefix_aux_weight_at(150, cfg) == 0.0
    ws = [prefix_aux_weight_at(s, cfg) for s in range(100)]
    assert all(a > b for a, b in zip(ws, ws[1:], strict=False))


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(TrainConfigError, match="prefix_aux_schedule"):
        _cfg(prefix_aux_weight=0.25, prefix_aux_schedule="cosine")


def test_trainer_feeds_the_scheduled_weight() -> None:
    """The loop's micro-batch carries the weight of the current step, not the start one."""
    class Loader:
        def next_batch(self) -> dict:
            z = torch.zeros(1, 4, dtype=torch.int64)
            return {"inputs": z, "targets": z + 1, "step": 0}

    cfg = _cfg(prefix_aux_weight=0.25, prefix_aux_schedule="anneal")
    run = SimpleNamespace(loader=Loader(), device=torch.device("cpu"), cfg=cfg,
                          tables=TokenTables(prefix=torch.full((8,), -1)), side={},
                          step=60)
    _, _, kw = Run.next_inputs(run)  # type: ignore[arg-type]
    assert kw["aux_weight"] == pytest.approx(0.1)
