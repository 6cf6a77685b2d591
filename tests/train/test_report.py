"""The run summary cannot be misread, a finished run is told from its metrics, and
checkpoints rotate (no training: fast)."""

from __future__ import annotations

import math

import torch

from tokenmill.train.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint
from tokenmill.train.config import TrainConfig
from tokenmill.train.report import RunResult, StepTimer, summary_table
from tokenmill.train.train import finished_run


def _result(**kw) -> RunResult:
    base = dict(out_dir="runs/x", steps_done=8, train_loss=[(7, 5.5), (8, 5.0)],
                val=[{"step": 0, "val_loss": 10.8}, {"step": 8, "val_loss": 6.2}],
                tokens_per_s=1234.0, lem_wait_frac=0.0, wall_s=3.0, steps_total=8,
                device="cpu", checkpoint="runs/x/checkpoints/step_0000008.pt",
                metrics_path="runs/x/metrics.json", plot_path="runs/x/loss.png")
    base.update(kw)
    return RunResult(**base)


def test_summary_plain_run():
    t = summary_table(_result())
    assert "masked" not in t and "lem_lag" not in t and "LEM" not in t
    for needle in ("device", "cpu", "8 of 8", "5.0000 (LM loss; no auxiliary loss)",
                   "10.8000 -> 6.2000", "runs/x/checkpoints/step_0000008.pt",
                   "runs/x/metrics.json", "runs/x/loss.png"):
        assert needle in t, (needle, t)


def test_summary_with_every_side_input():
    r = _result(train_aux_loss=[(7, 0.4), (8, 0.3)], prefix_aux_weight=0.3,
                legality="gpt2.legality", lem=True, lem_ahead=4, lem_mean_lag=3.5,
                lem_wait_frac=0.02,
                val=[{"step": 8, "val_loss": 6.2, "val_loss_masked": 6.1, "masked_targets": 0}])
    t = summary_table(r)
    for needle in ("5.0000 = LM 4.7000 + prefix aux 0.3000 (weight 0.3)",
                   "legality-masked (last)  6.1000", "0 (0 for a sound table)",
                   "LEM wait / step time", "2.0%", "3.5 of 4 steps",
                   "0 = the trainer waited for it"):
        assert needle in t, (needle, t)


def test_summary_paused_run_and_json_roundtrip():
    r = _result(stopped_early=True, steps_done=4, steps_total=8, plot_path="")
    t = summary_table(r)
    assert "4 of 8 (paused; continue with --resume)" in t
    assert "written when the run completes" in t
    back = RunResult.from_json(r.to_json())
    assert back == r or (math.isnan(back.mfu) and back.train_loss == r.train_loss)


def test_checkpoints_rotate(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, {"step": step, "w": torch.zeros(2)}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000004.pt",
                                                            "step_0000005.pt"]
    for step in range(6, 8):
        save_checkpoint(tmp_path, step, {"step": step}, keep=0)  # 0 keeps all
    assert len(list_checkpoints(tmp_path)) == 4
    assert latest_checkpoint(tmp_path).name == "step_0000007.pt"


def test_checkpoint_rotation_keeps_the_newest_by_step(tmp_path):
    """A step saved again stays with keep=1; a step older than those already there is the
    one rotated out, as it is not among the newest."""
    for step in (8, 9):
        save_checkpoint(tmp_path, step, {"step": step}, keep=0)
    save_checkpoint(tmp_path, 9, {"step": 9}, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000009.pt"]
    save_checkpoint(tmp_path, 8, {"step": 8}, keep=0)
    save_checkpoint(tmp_path, 3, {"step": 3}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000008.pt",
                                                            "step_0000009.pt"]


def test_finished_run_is_told_from_its_metrics(tmp_path):
    """``--resume`` finds a run complete when its metrics.json reached the steps asked for
    without a pause; a paused run, a run asked for more steps or a folder without metrics
    has more to do."""
    def cfg(steps: int) -> TrainConfig:
        return TrainConfig(data="unused", out_dir=str(tmp_path), steps=steps)

    assert finished_run(cfg(8)) is None
    metrics = tmp_path / "metrics.json"
    metrics.write_text(_result(stopped_early=True, steps_done=4, plot_path="").to_json())
    assert finished_run(cfg(8)) is None
    metrics.write_text(_result().to_json())
    assert finished_run(cfg(8)).steps_done == 8
    assert finished_run(cfg(6)).steps_done == 8
    assert finished_run(cfg(12)) is None


def test_step_timer_leaves_the_first_step_out_of_tokens_per_s():
    timer = StepTimer()
    timer.add(5.0)  # warm-up and compilation
    assert math.isnan(timer.tokens_per_s(100))
    timer.add(1.0)
    timer.add(1.0)
    assert timer.tokens_per_s(100) == 100.0 and timer.t_all == 7.0
