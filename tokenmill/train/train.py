"""The reference training loop: ``tokenmill train CONFIG``.

One loop for a CPU smoke run and for ``torchrun`` data parallel on GPUs, in two parts as in
nanoGPT's ``train.py``: :func:`setup` builds a :class:`Run` (data, tokenizer tables, side
inputs, device, model, optimizer, restored state), and :func:`training_loop` reads top to
bottom: learning rate, forward/backward per micro-step, clip, optimizer step, log, evaluate,
checkpoint.

* data, opened once (:func:`tokenmill.train.batches.open_data`: the manifest read and its
  shards verified): document-aligned rows, one pass over a training-mix manifest or a
  curation manifest, no replacement;
* side inputs, one interface (:class:`tokenmill.train.side.SideInput`): the LEM feature
  (position mode, from the global stream, so the same for any number of ranks: read from a
  side channel made before the run with ``tokenmill ngram lem`` (``lem_features``), from
  Ray CPU workers running ahead chunk by chunk (``lem_workers``,
  :mod:`tokenmill.train.lemworkers`), or from the online longest-exact-match predictor in
  its own process, :mod:`tokenmill.train.lemside`), the n-gram model's top-m candidates and
  log-probabilities (``ngram_features``, :mod:`tokenmill.train.ngramside`: an input feature
  and a gated sparse logit bias in the fused cross-entropy); beside them the tokenizer
  tables, opened once (:class:`tokenmill.train.targets.TokenTables`): the prefix auxiliary
  target and the legality mask at evaluation;
* AdamW with a cosine or trapezoid (warmup-stable-decay) schedule, gradient clipping, bf16
  autocast on GPU and fp32 on CPU;
* periodic validation on fixed val rows, with and without the legality mask (and the count
  of masked targets, which must be 0 for a sound table);
* checkpoints that resume exactly (:mod:`tokenmill.train.checkpoint`), the newest
  ``keep_checkpoints`` kept; a resumed run reproduces the uninterrupted losses bit for bit
  on CPU, and ``--resume`` on a finished run says it is complete;
* a tqdm bar with tokens/s and ``lem_lag`` (steps the LEM predictor is ahead of the
  trainer; 0 means the trainer waits for it), a ``metrics.json``, a ``loss.png`` and a
  summary table (:mod:`tokenmill.train.report`).

The config is YAML or JSON with the fields of :class:`~tokenmill.train.config.TrainConfig`;
paths are relative to the config file. A CPU smoke run on the quickstart output::

    # train-tiny.yaml
    data: out/quickstart            # curation manifest folder, or a `tokenmill mix` manifest
    out_dir: runs/tiny
    model: tiny                     # tiny | small | gpt2-small (GPTConfig.preset)
    seq_len: 128
    batch_size: 8
    steps: 300
    lr: 5.0e-3
    prefix_aux_weight: 0.3          # optional: prefix auxiliary loss
    lem: true                       # optional: LEM side input (LEMStream process)
    lem_features: lem/              # optional: ... read from `tokenmill ngram lem` output
    # lem_workers: 4                # optional: ... or computed by 4 Ray CPU workers
    # ngram_features: ngram/        # optional: `tokenmill ngram features MIX -o ngram/`
    legality: gpt2.legality         # optional: masked validation loss

    tokenmill train train-tiny.yaml                 # one process
    tokenmill train train-tiny.yaml --resume        # continue from the latest checkpoint
    torchrun --nproc-per-node 8 -m tokenmill.cli train gpt2.yaml   # data parallel

``batch_size`` is per rank and micro-step; a step is ``batch_size * grad_accum * world``
sequences. The logged train loss includes the prefix auxiliary term when it is on (the
summary splits it into LM and auxiliary loss); validation losses are plain next-token
losses (nats/token).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from tokenmill.atomic import atomic_write_text
from tokenmill.train.batches import TrainData, doc_ids, open_data
from tokenmill.train.checkpoint import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tokenmill.train.config import TrainConfig
from tokenmill.train.data import MixLoader
from tokenmill.train.kernels import fused_cross_entropy, masked_target_count
from tokenmill.train.lemside import LEMFeed, LEMSideChannel
from tokenmill.train.lemworkers import LEMWorkers
from tokenmill.train.model import GPT, GPTConfig
from tokenmill.train.ngramside import NgramSideChannel
from tokenmill.train.report import METRICS_FILE, RunResult, StepTimer, run_result, write_report
from tokenmill.train.side import SideInput, SideInputKind
from tokenmill.train.targets import TokenTables, open_tables

__all__ = ["Run", "RunResult", "TrainConfig", "evaluate", "latest_checkpoint", "lr_at",
           "setup", "train", "training_loop"]

PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12}


# ----------------------------------------------------------------------------------------------
# schedules
# ----------------------------------------------------------------------------------------------


def prefix_aux_weight_at(step: int, cfg: TrainConfig) -> float:
    """Weight of the prefix auxiliary loss at optimizer step ``step`` (0-based):
    ``prefix_aux_weight``, or with ``prefix_aux_schedule: anneal`` that weight times
    ``1 - step / steps`` (linear to 0 over training, as the NanoGPT speedrun anneals its
    0.25)."""
    if cfg.prefix_aux_schedule == "constant":
        return cfg.prefix_aux_weight
    return cfg.prefix_aux_weight * max(0.0, 1.0 - step / cfg.steps)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine decay
    to ``min_lr_frac * lr`` or a trapezoid (constant, then linear decay over the last
    ``cooldown_frac`` of the steps: warmup-stable-decay, Hägele et al. 2024)."""
    lo = cfg.lr * cfg.min_lr_frac
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "cosine":
        span = max(1, cfg.steps - cfg.warmup_steps)
        frac = min(1.0, (step - cfg.warmup_steps) / span)
        return lo + 0.5 * (cfg.lr - lo) * (1 + math.cos(math.pi * frac))
    cool = max(1, int(cfg.steps * cfg.cooldown_frac))
    start = cfg.steps - cool
    if step < start:
        return cfg.lr
    return cfg.lr - (cfg.lr - lo) * min(1.0, (step - start + 1) / cool)


# ----------------------------------------------------------------------------------------------
# the run: everything the loop needs
# ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    """A run set up by :func:`setup`: what :func:`training_loop` reads and updates.

    ``data`` is the run's opened data and ``loader`` this rank's train loader over it; ``val``
    the fixed validation rows; ``tables`` the tokenizer tables (legality rows, prefix map) on
    the device. ``side`` holds the side inputs by name (``"lem"``, ``"ngram"``) and
    ``val_side`` their validation features by model keyword. ``model`` is the bare module
    (checkpoints, evaluation); ``net`` is what the loop calls (``model`` compiled and/or wrapped
    in DDP); ``flops_per_token`` its training FLOPs per token, ``peak_flops`` the peak FLOP/s
    of all ranks' devices together (0: unknown) and ``device_name`` the devices in words, for
    the report. ``step`` is the number of optimizer steps done and ``checkpoint`` the newest
    checkpoint written or resumed from; ``history`` / ``aux_history`` hold ``(step, loss)`` of
    the optimized loss and of its weighted prefix auxiliary term; ``val_hist`` one dict per
    evaluation.
    """

    cfg: TrainConfig
    device: torch.device
    data: TrainData
    loader: MixLoader
    val: torch.Tensor
    model: GPT
    net: torch.nn.Module
    opt: torch.optim.Optimizer
    autocast: Callable[[], AbstractContextManager]
    flops_per_token: float
    peak_flops: float = 0.0
    device_name: str = ""
    tables: TokenTables = field(default_factory=TokenTables)
    side: dict[str, SideInput] = field(default_factory=dict)
    val_side: dict[str, np.ndarray] = field(default_factory=dict)
    step: int = 0
    checkpoint: Path | None = None
    history: list[tuple[int, float]] = field(default_factory=list)
    aux_history: list[tuple[int, float]] = field(default_factory=list)
    val_hist: list[dict[str, float]] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return Path(self.cfg.out_dir)

    @property
    def rank(self) -> int:
        return self.data.rank

    @property
    def world(self) -> int:
        return self.data.world

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def ddp(self) -> bool:
        return self.world > 1

    @property
    def lem(self) -> SideInput | None:
        """The LEM side input, if the run has one."""
        return self.side.get("lem")

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.cfg.seq_len * self.cfg.grad_accum * self.world

    def next_inputs(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """This rank's next micro-batch on the device: inputs, targets ``int64 [B, T]`` and
        the model's side-input keywords (document ids, prefix targets, LEM and n-gram
        features)."""
        d = self.loader.next_batch()
        x = d["inputs"].to(self.device, non_blocking=True)
        y = d["targets"].to(self.device, non_blocking=True)
        kw: dict[str, Any] = {}
        if self.cfg.doc_mask:
            kw["doc_ids"] = doc_ids(d["cu_seqlens"], *x.shape).to(self.device)
        if self.tables.prefix is not None:
            kw.update(aux_targets=self.tables.prefix[y],
                      aux_weight=prefix_aux_weight_at(self.step, self.cfg))
        for feed in self.side.values():  # by the loader's global step: resume, ranks, accum
            kw.update(zip(feed.names, (t.to(self.device) for t in feed.get(int(d["step"]))),
                          strict=True))
        return x, y, kw

    def no_sync(self, micro: int) -> AbstractContextManager:
        """DDP: skip the gradient all-reduce on every micro-step but the last."""
        last = micro == self.cfg.grad_accum - 1
        return nullcontext() if (not self.ddp or last) else self.net.no_sync()

    def mean_over_ranks(self, *values: float) -> tuple[float, ...]:
        """All-reduced means of per-rank scalars (the values themselves without DDP)."""
        if not self.ddp:
            return values
        t = torch.tensor(values, device=self.device, dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return tuple(float(v) / self.world for v in t)

    def evaluate(self) -> dict[str, float]:
        """Validation losses now (see :func:`evaluate`)."""
        return evaluate(self.model, self.val, self.device, self.cfg.batch_size,
                        self.autocast, self.tables.mask_bits, self.val_side)

    def save(self) -> Path:
        """Write the checkpoint of the current step (rank 0), keeping the newest
        ``keep_checkpoints``; it becomes :attr:`checkpoint`."""
        self.checkpoint = path = checkpoint_path(self.out, self.step)
        if self.master:
            state = {
                "step": self.step, "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(), "loader": self.loader.state_dict(),
                "rng_cpu": torch.get_rng_state(), "rng_numpy": np.random.get_state(),
                "history": self.history, "aux_history": self.aux_history,
                "val": self.val_hist, "config": self.cfg.to_dict(),
                "model_config": self.model.cfg.to_dict(),
            }
            save_checkpoint(self.out, self.step, state, keep=self.cfg.keep_checkpoints)
        return path

    def close(self) -> None:
        """Stop the side inputs' producers (predictor process, Ray workers), if any."""
        for feed in self.side.values():
            feed.close()


# ----------------------------------------------------------------------------------------------
# setup
# ----------------------------------------------------------------------------------------------


def _dist_env() -> tuple[int, int, int]:
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def device_type(cfg: TrainConfig) -> str:
    """``cuda`` or ``cpu``: ``cfg.device``, with ``auto`` meaning CUDA when available.

    Raises:
        RuntimeError: ``device: cuda`` on a machine without CUDA (one line).
    """
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device cuda: CUDA is not available to torch {torch.__version__} "
                           "on this machine; use --device cpu")
    return cfg.device


def init_device(cfg: TrainConfig) -> torch.device:
    """The device of this process (``torchrun``'s ``LOCAL_RANK``); joins the process group
    when there are several ranks (``WORLD_SIZE``).

    Raises:
        RuntimeError: ``device: cuda`` on a machine without CUDA (one line).
    """
    _, world, local_rank = _dist_env()
    dev_type = device_type(cfg)
    device = torch.device(dev_type, local_rank) if dev_type == "cuda" else torch.device("cpu")
    if dev_type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev_type == "cuda" else "gloo")
    return device


def device_name(device: torch.device, world: int) -> str:
    """``cpu`` or ``cuda:0 (NVIDIA H200)``, with the number of ranks under DDP."""
    name = str(device)
    if device.type == "cuda":
        name += f" ({torch.cuda.get_device_name(device)})"
    return name + (f", {world} ranks (DDP)" if world > 1 else "")


def peak_flops(device: torch.device, cfg: TrainConfig) -> float:
    """Peak bf16 dense FLOP/s of one device, for MFU: ``cfg.peak_flops``, else a guess from
    the CUDA device's name (:data:`PEAK_FLOPS`), else 0 (MFU not reported)."""
    if cfg.peak_flops > 0:
        return cfg.peak_flops
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), 0.0)


def _restore(run: Run) -> None:
    """Load the newest checkpoint into ``run`` (model, optimizer, loader, RNGs, history)."""
    ck = latest_checkpoint(run.out)
    if ck is None:
        raise ValueError(f"--resume: no checkpoint under {run.out / 'checkpoints'}")
    state = load_checkpoint(ck, run.device)
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.loader.load_state_dict(state["loader"])
    torch.set_rng_state(state["rng_cpu"].cpu())
    np.random.set_state(state["rng_numpy"])
    run.step = int(state["step"])
    run.history = [tuple(h) for h in state["history"]]
    run.aux_history = [tuple(h) for h in state.get("aux_history", [])]
    run.val_hist = list(state["val"])
    run.checkpoint = ck


#: every kind of side input (:class:`~tokenmill.train.side.SideInputKind`); the config
#: selects at most one of each key
SIDE_INPUTS: tuple[SideInputKind, ...] = (LEMSideChannel, LEMFeed, LEMWorkers, NgramSideChannel)


def open_side_inputs(data: TrainData, cfg: TrainConfig) -> dict[str, SideInput]:
    """The side inputs ``cfg`` asks for, by key; those opened are closed again if another
    fails."""
    side: dict[str, SideInput] = {}
    try:
        for kind in SIDE_INPUTS:
            feed = kind.from_config(data, cfg)
            if feed is not None:
                side[kind.key] = feed
    except BaseException:
        for feed in side.values():
            feed.close()
        raise
    return side


def _build(cfg: TrainConfig, data: TrainData, loader: MixLoader, val: torch.Tensor,
           side: dict[str, SideInput], resume: bool) -> Run:
    """Device and process group, the tokenizer tables on the device, model and optimizer
    (the same seed on every rank), with ``resume`` the newest checkpoint's state, the side
    inputs continued at the run's step, and the module the loop calls: compiled and/or
    wrapped in DDP, as nanoGPT's ``train.py`` does."""
    device = init_device(cfg)
    peak, name = peak_flops(device, cfg) * data.world, device_name(device, data.world)
    tables = open_tables(cfg, data.tokenizer, str(data.manifest_path), device)
    torch.manual_seed(cfg.seed)  # the same initial model on every rank
    ngram = side.get("ngram")
    mcfg = GPTConfig.preset(cfg.model, vocab_size=data.tokenizer.n_vocab,
                            max_seq_len=cfg.seq_len, lem=cfg.lem, lem_k=cfg.lem_k,
                            ngram=ngram is not None,
                            ngram_m=ngram.m if ngram is not None else 8,
                            **cfg.model_overrides)
    model = GPT(mcfg).to(device)
    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda"
                else nullcontext)
    run = Run(cfg, device, data, loader, val, model, model, opt, autocast,
              model.flops_per_token(cfg.seq_len), peak, name, tables, side)
    if resume:
        _restore(run)
    for feed in side.values():  # read from the run's step on; validation features made once
        feed.skip_to(run.step)
        if cfg.val_every > 0:
            run.val_side.update(zip(feed.names, feed.for_validation(val), strict=True))
    if cfg.compile:
        run.net = torch.compile(model)
    if data.world > 1:
        ids = [device.index] if device.type == "cuda" else None
        run.net = torch.nn.parallel.DistributedDataParallel(run.net, device_ids=ids)
    return run


def setup(cfg: TrainConfig, resume: bool = False) -> Run:
    """Build a :class:`Run`: the data opened once (manifest read, shards verified), this
    rank's train loader (budget checked) and the validation rows, the tokenizer tables
    (legality rows, prefix map), the side inputs (side channels checked; the LEM
    predictor's process forked before CUDA is initialised), device and process group,
    model and optimizer (same seed on every rank), and with ``resume`` the state of the
    newest checkpoint (side inputs continue at its step).

    Raises:
        ValueError: bad data, table or side channel (names the file), a budget too small
            for ``steps``, or ``resume`` without a checkpoint.
        RuntimeError: ``device: cuda`` without CUDA.
    """
    device_type(cfg)  # before any work
    rank, world, _ = _dist_env()
    if rank == 0 and not cfg.verify:
        print("shard verification is off (verify: false / --no-verify)")
    data = open_data(cfg, rank, world)
    loader = data.train_loader(cfg.steps * cfg.grad_accum)
    val = data.validation_rows(cfg.val_tokens)
    side = open_side_inputs(data, cfg)
    try:
        run = _build(cfg, data, loader, val, side, resume)
    except BaseException:
        for feed in side.values():
            feed.close()
        raise
    if run.master:
        (run.out / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.out / "config.json", json.dumps(cfg.to_dict(), indent=2) + "\n")
    return run


def finished_run(cfg: TrainConfig) -> RunResult | None:
    """The result of the run in ``cfg.out_dir`` if it already reached ``cfg.steps``: its
    ``metrics.json``, written after the final checkpoint, says so (and not paused by
    ``stop_after``); ``None`` if there is more to do."""
    metrics = Path(cfg.out_dir) / METRICS_FILE
    if not metrics.is_file():
        return None
    r = RunResult.from_json(metrics.read_text())
    return r if r.steps_done >= cfg.steps and not r.stopped_early else None


# ----------------------------------------------------------------------------------------------
# evaluation and the loop
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: GPT,
    val: torch.Tensor,
    device: torch.device,
    batch_size: int,
    autocast: Callable[[], AbstractContextManager],
    mask_bits: torch.Tensor | None = None,
    side: dict[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Mean validation loss (nats/token) of ``val`` (``int64 [Nv, T + 1]`` rows) and, with
    ``mask_bits``, the loss renormalised over the tokens the legality table allows after
    each previous token (``val_loss_masked``) and the number of val targets the table marks
    impossible (``masked_targets``, 0 for a sound table). ``side``: the side inputs of the
    rows by model keyword (``[Nv, T]`` / ``[Nv, T, k]`` arrays), when the model takes them."""
    was = model.training
    model.eval()
    tot, tot_m, n, bad = 0.0, 0.0, 0, 0
    for i in range(0, val.shape[0], batch_size):
        seq = val[i : i + batch_size].to(device)
        x, y = seq[:, :-1], seq[:, 1:]
        kw = {name: torch.as_tensor(a[i : i + batch_size]).to(device)
              for name, a in (side or {}).items()}
        with autocast():
            logits = model(x, **kw).reshape(-1, model.cfg.vocab_size)  # one forward for both
            tgt, prev = y.reshape(-1), x.reshape(-1)
            tot += float(fused_cross_entropy(logits, tgt, reduction="sum"))
            if mask_bits is not None:
                tot_m += float(fused_cross_entropy(logits, tgt, prev_ids=prev,
                                                   mask_bits=mask_bits, reduction="sum"))
                bad += masked_target_count(tgt, prev, mask_bits)
        n += y.numel()
    model.train(was)
    out = {"val_loss": tot / n}
    if mask_bits is not None:
        out.update(val_loss_masked=tot_m / n, masked_targets=float(bad))
    return out


def _progress(run: Run) -> tqdm | None:
    if not (run.master and run.cfg.progress):
        return None
    return tqdm(total=run.cfg.steps, initial=run.step, desc="train", unit="step")


def _log_step(bar: tqdm | None, run: Run, lr: float, loss: float, dt: float) -> None:
    if bar is None:
        return
    post = {"loss": f"{loss:.3f}", "lr": f"{lr:.2e}",
            "tok/s": f"{run.tokens_per_step / max(dt, 1e-9):,.0f}"}
    if run.lem is not None:
        post["lem_lag"] = run.lem.lag  # steps the LEM predictor is ahead (0 = waiting)
    bar.set_postfix(post)
    bar.update(1)


def _log_val(bar: tqdm | None, run: Run) -> None:
    if bar is not None:
        bar.write(f"step {run.step}: " + ", ".join(
            f"{k}={v:.4f}" for k, v in run.val_hist[-1].items() if k != "step"))


def training_loop(run: Run) -> RunResult:
    """Train ``run`` from ``run.step`` to ``cfg.steps`` (or ``stop_after``), evaluating every
    ``val_every`` steps and at the end, checkpointing every ``ckpt_every`` steps and at the
    end; returns the :class:`RunResult` (:func:`~tokenmill.train.report.run_result`, from
    the run and the :class:`~tokenmill.train.report.StepTimer` of its steps; rank 0 also
    writes it, :func:`~tokenmill.train.report.write_report`)."""
    cfg = run.cfg
    bar = _progress(run)
    timer = StepTimer()
    if run.step == 0 and cfg.val_every > 0:
        run.val_hist.append({"step": 0, **run.evaluate()})
    stopped = False
    try:
        while run.step < cfg.steps:
            t0 = time.perf_counter()
            lr = lr_at(run.step, cfg)
            for g in run.opt.param_groups:
                g["lr"] = lr
            loss_sum, aux_sum = 0.0, 0.0
            for micro in range(cfg.grad_accum):
                x, y, kw = run.next_inputs()
                with run.no_sync(micro):
                    with run.autocast():
                        loss, aux = run.net(x, y, return_aux=True, **kw)
                        loss, aux = loss / cfg.grad_accum, aux / cfg.grad_accum
                    loss.backward()
                loss_sum += float(loss.detach())
                aux_sum += float(aux)
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
            run.opt.step()
            run.opt.zero_grad(set_to_none=True)
            run.step += 1

            loss_sum, aux_sum = run.mean_over_ranks(loss_sum, aux_sum)
            run.history.append((run.step, loss_sum))
            if run.tables.prefix is not None:
                run.aux_history.append((run.step, aux_sum))
            dt = time.perf_counter() - t0
            timer.add(dt)
            _log_step(bar, run, lr, loss_sum, dt)

            if cfg.val_every > 0 and (run.step % cfg.val_every == 0 or run.step == cfg.steps):
                run.val_hist.append({"step": run.step, **run.evaluate()})
                _log_val(bar, run)
            stopped = cfg.stop_after is not None and cfg.stop_after <= run.step < cfg.steps
            if (stopped or run.step == cfg.steps
                    or (cfg.ckpt_every > 0 and run.step % cfg.ckpt_every == 0)):
                run.save()
            if stopped:
                break
    finally:
        if bar is not None:
            bar.close()
    result = run_result(run, timer, stopped)
    if run.master:
        write_report(result)
    if run.ddp:
        torch.distributed.barrier()
    return result


def train(cfg: TrainConfig, resume: bool = False) -> RunResult:
    """Run (or, with ``resume``, continue) training; see the module docstring.

    Returns:
        the :class:`RunResult`; on ``resume`` of a run that already reached ``cfg.steps``,
        says so and returns the finished run's result without training.

    Raises:
        ValueError: bad data or config (the message names the file/key), ``resume``
            without a checkpoint.
        RuntimeError: ``device: cuda`` without CUDA.
    """
    if resume and (done := finished_run(cfg)) is not None:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"{cfg.out_dir}: the run is complete ({done.steps_done} of {cfg.steps} "
                  f"steps, checkpoint {done.checkpoint}); nothing to resume (raise --steps "
                  "to train further)")
        return done
    run = setup(cfg, resume)
    try:
        return training_loop(run)
    finally:
        run.close()
