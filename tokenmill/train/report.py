"""What a run reports: :class:`RunResult` (``metrics.json``), made from the run and its
:class:`StepTimer` by :func:`run_result`; the summary table and the plot, written with it by
:func:`write_report`."""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from tokenmill.atomic import atomic_write_bytes, atomic_write_text
from tokenmill.train.config import TrainConfig
from tokenmill.train.side import SideInput

#: the run's result in its ``out_dir`` (:meth:`RunResult.to_json`), and its loss plot
METRICS_FILE = "metrics.json"
PLOT_FILE = "loss.png"


@dataclass
class RunResult:
    """What a run returns (also written to ``out_dir/metrics.json``).

    Losses are nats/token. ``train_loss`` is the optimized loss per step (LM loss plus the
    weighted prefix auxiliary term when that is on); ``train_aux_loss`` is that auxiliary
    term per step (empty when off), so the LM loss is the difference. ``val`` holds one dict
    per evaluation: ``step``, ``val_loss`` and, with a legality table, ``val_loss_masked``
    and ``masked_targets``. ``lem_mean_lag`` is the mean number of steps the LEM predictor
    was ahead of the trainer (at most ``lem_ahead``; 0 means the trainer waited for it).
    """

    out_dir: str
    steps_done: int
    train_loss: list[tuple[int, float]]
    val: list[dict[str, float]]
    tokens_per_s: float
    lem_wait_frac: float
    wall_s: float
    mfu: float = float("nan")
    stopped_early: bool = False
    steps_total: int = 0
    device: str = ""
    checkpoint: str = ""
    metrics_path: str = ""
    plot_path: str = ""
    train_aux_loss: list[tuple[int, float]] = field(default_factory=list)
    prefix_aux_weight: float = 0.0
    legality: str | None = None
    lem: bool = False
    lem_ahead: int = 0
    lem_mean_lag: float = float("nan")

    def to_json(self) -> str:
        """The result as indented JSON (what ``metrics.json`` holds)."""
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        """Read :meth:`to_json` output back (loss pairs as tuples)."""
        d = json.loads(text)
        for key in ("train_loss", "train_aux_loss"):
            d[key] = [tuple(x) for x in d.get(key, [])]
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class StepTimer:
    """Wall times (s) of the steps this process runs: all of them (for the LEM wait share)
    and all but the first (which includes warm-up and compilation), for tokens/s."""

    steps: int = 0
    t_all: float = 0.0
    t_timed: float = 0.0
    t_start: float = field(default_factory=time.perf_counter)

    def add(self, dt: float) -> None:
        """Count one step that took ``dt`` seconds."""
        if self.steps > 0:
            self.t_timed += dt
        self.t_all += dt
        self.steps += 1

    def tokens_per_s(self, tokens_per_step: int) -> float:
        """Tokens/s over the timed steps (NaN before the second step)."""
        timed = self.steps - 1
        return tokens_per_step * timed / self.t_timed if self.t_timed > 0 else float("nan")


class ReportedRun(Protocol):
    """What :func:`run_result` reads from a run (a :class:`tokenmill.train.train.Run`)."""

    cfg: TrainConfig
    step: int
    checkpoint: Path | None
    history: list[tuple[int, float]]
    aux_history: list[tuple[int, float]]
    val_hist: list[dict[str, float]]
    flops_per_token: float
    peak_flops: float
    device_name: str

    @property
    def tokens_per_step(self) -> int: ...

    @property
    def lem(self) -> SideInput | None: ...


def run_result(run: ReportedRun, timer: StepTimer, stopped: bool) -> RunResult:
    """What ``run`` reports now: its losses, speed from ``timer`` (tokens/s, MFU, the LEM
    wait share), where its files are (:data:`METRICS_FILE` and :data:`PLOT_FILE` in its
    ``out_dir``); ``stopped``: paused by ``stop_after`` (no loss plot)."""
    cfg, feed, out = run.cfg, run.lem, Path(run.cfg.out_dir)
    tps = timer.tokens_per_s(run.tokens_per_step)
    return RunResult(
        out_dir=str(out), steps_done=run.step, train_loss=run.history,
        val=run.val_hist, tokens_per_s=tps,
        lem_wait_frac=feed.wait_s / timer.t_all if feed and timer.t_all else 0.0,
        wall_s=time.perf_counter() - timer.t_start,
        mfu=run.flops_per_token * tps / run.peak_flops if run.peak_flops else math.nan,
        stopped_early=stopped, steps_total=cfg.steps, device=run.device_name,
        checkpoint=str(run.checkpoint), metrics_path=str(out / METRICS_FILE),
        plot_path="" if stopped else str(out / PLOT_FILE),
        train_aux_loss=run.aux_history, prefix_aux_weight=cfg.prefix_aux_weight,
        legality=cfg.legality, lem=cfg.lem, lem_ahead=cfg.lem_ahead,
        lem_mean_lag=feed.mean_lag if feed else math.nan)


def _fmt(x: float, spec: str = ".4f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _train_loss_row(r: RunResult) -> str:
    if not r.train_loss:
        return "-"
    total = r.train_loss[-1][1]
    if not r.train_aux_loss:
        return f"{total:.4f} (LM loss; no auxiliary loss)"
    aux = r.train_aux_loss[-1][1]
    return (f"{total:.4f} = LM {total - aux:.4f} + prefix aux {aux:.4f} "
            f"(weight {r.prefix_aux_weight:g})")


def _val_rows(r: RunResult) -> list[tuple[str, str]]:
    last = r.val[-1] if r.val else {}
    first = r.val[0] if r.val else {}
    rows = [("val loss (first -> last)",
             f"{_fmt(first.get('val_loss', math.nan))} -> {_fmt(last.get('val_loss', math.nan))}")]
    if r.legality:
        rows += [
            ("val loss, legality-masked (last)", _fmt(last.get("val_loss_masked", math.nan))),
            ("masked val targets (last)",
             f"{int(last.get('masked_targets', 0))} (0 for a sound table)"),
        ]
    return rows


def _lem_rows(r: RunResult) -> list[tuple[str, str]]:
    if not r.lem:
        return []
    return [
        ("LEM wait / step time", f"{r.lem_wait_frac:.1%}"),
        ("lem_lag (mean)", f"{_fmt(r.lem_mean_lag, '.1f')} of {r.lem_ahead} steps: how far the "
         "LEM predictor ran ahead of the trainer (0 = the trainer waited for it)"),
    ]


def summary_table(r: RunResult) -> str:
    """The end-of-run summary: device, steps, train loss split into LM and auxiliary loss,
    validation (masked only with a legality table), speed, LEM lag, and where the
    checkpoint, metrics and plot are."""
    steps = f"{r.steps_done} of {r.steps_total or r.steps_done}"
    if r.stopped_early:
        steps += " (paused; continue with --resume)"
    rows = [("device", r.device or "-"), ("steps", steps),
            ("train loss (last step)", _train_loss_row(r)), *_val_rows(r),
            ("tokens/s", _fmt(r.tokens_per_s, ",.0f")),
            ("MFU", f"{r.mfu:.1%}" if math.isfinite(r.mfu) else "-"), *_lem_rows(r),
            ("wall s", f"{r.wall_s:.1f}"), ("checkpoint", r.checkpoint or "-"),
            ("metrics", r.metrics_path or "-"),
            ("loss plot", r.plot_path or "- (written when the run completes)")]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def loss_plot_png(r: RunResult) -> bytes:
    """Train loss per step (and its LM part when an auxiliary loss is on) and val loss
    (unmasked / masked) per evaluation, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if r.train_loss:
        s, loss = zip(*r.train_loss, strict=True)
        ax.plot(s, loss, lw=0.8, alpha=0.7, label="train")
        if r.train_aux_loss:
            aux = [a for _, a in r.train_aux_loss]
            ax.plot(s, [t - a for t, a in zip(loss, aux, strict=True)], lw=0.8, alpha=0.7,
                    label="train (LM part)")
    if r.val:
        vs = [v["step"] for v in r.val]
        ax.plot(vs, [v["val_loss"] for v in r.val], "o-", label="val")
        if "val_loss_masked" in r.val[0]:
            ax.plot(vs, [v["val_loss_masked"] for v in r.val], "s--", label="val (legality mask)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_report(r: RunResult) -> None:
    """Write ``r`` to ``r.metrics_path`` and, for a run that completed, its loss plot
    (:func:`loss_plot_png`) to ``r.plot_path``, both atomically; then print the summary
    table."""
    table = summary_table(r)
    png = loss_plot_png(r) if r.plot_path else None
    atomic_write_text(Path(r.metrics_path), r.to_json())
    if png is not None:
        atomic_write_bytes(Path(r.plot_path), png)
    print(table)
