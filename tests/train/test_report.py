"""The run summary cannot be misread, and checkpoints rotate (no training: fast)."""

from __future__ import annotations

import math

import torch

from tokenmill.train.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint
from tokenmill.train.report import RunResult, summary_table


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
