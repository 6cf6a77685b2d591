"""The reference training loop: ``tokenmill train CONFIG``.

One loop for a CPU smoke run and for ``torchrun`` data parallel on GPUs:

* data: the datamix loader (:mod:`tokenmill.train.data`) when the manifest is a training
  datamix and the loader is installed, otherwise :class:`StreamLoader` (contiguous windows
  over a curation manifest's train shards, deterministic and exactly resumable);
* side inputs: the prefix auxiliary target (longest-token prefix of each target,
  :mod:`tokenmill.tokenizers.prefix`), the LEM feature from the online longest-exact-match
  predictor running in its own process (:class:`tokenmill.ngram.LEMStream`), and the
  legality mask at evaluation (:mod:`tokenmill.tokenizers.legality`, or a ``.npy`` of packed
  rows);
* AdamW with a cosine or trapezoid (warmup-stable-decay) schedule, gradient clipping, bf16
  autocast on GPU and fp32 on CPU;
* periodic validation on a fixed slice of the val shards, with and without the legality mask
  (and the count of masked targets, which must be 0 for a sound table);
* checkpoints that resume exactly: model, optimizer, step, loader state, RNG states and the
  loss history; a resumed run reproduces the uninterrupted losses bit for bit on CPU;
* a tqdm bar with tokens/s and the predictor's lag, a ``metrics.json`` and a ``loss.png``.

The config is YAML or JSON with the fields of :class:`TrainConfig`.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenmill.atomic import atomic_write_bytes, atomic_write_text
from tokenmill.manifests.schema import load_manifest
from tokenmill.pipeline.shards import read_tokens
from tokenmill.train.kernels import masked_target_count
from tokenmill.train.model import GPT, GPTConfig

# ----------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Everything a run needs. Paths in a config file are relative to that file."""

    data: str  # manifest.json (or its folder)
    out_dir: str = "runs/train"
    model: str = "tiny"  # GPTConfig preset
    model_overrides: dict[str, Any] = field(default_factory=dict)
    seq_len: int = 128
    batch_size: int = 8  # sequences per rank per micro-step
    grad_accum: int = 1
    steps: int = 200
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 10
    schedule: str = "cosine"  # cosine | trapezoid
    cooldown_frac: float = 0.3  # trapezoid: fraction of steps in the final linear decay
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    val_every: int = 50
    val_tokens: int = 16384
    ckpt_every: int = 0  # 0 = only at the end
    stop_after: int | None = None  # stop (with a checkpoint) after this step: a planned pause
    prefix_aux_weight: float = 0.0  # > 0: prefix auxiliary loss with this weight
    legality: str | None = None  # legality table (file or dir) or .npy packed rows
    lem: bool = False
    lem_k: int = 4
    lem_ahead: int = 4  # LEMStream slots ahead of the trainer
    lem_window: int | None = None  # predictor memory window (tokens); None = predictor default
    loader: str = "auto"  # auto | datamix | stream
    device: str = "auto"  # auto | cpu | cuda
    num_threads: int = 0  # CPU torch threads (0 = torch default)
    peak_flops: float = 0.0  # per device, for MFU; 0 = guess from the device name
    compile: bool = False
    progress: bool = True

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides: Any) -> TrainConfig:
        """Read YAML or JSON; ``data``/``out_dir``/``legality`` are resolved against the
        config file's folder. Unknown keys raise ``ValueError`` naming them."""
        p = Path(path)
        text = p.read_text()
        if p.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text) or {}
        else:
            raw = json.loads(text)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{p}: unknown train config keys {unknown}")
        for key in ("data", "out_dir", "legality"):
            if raw.get(key) and not Path(raw[key]).is_absolute() and key not in overrides:
                raw[key] = str((p.parent / raw[key]).resolve())
        return cls(**raw)

    def validate(self) -> None:
        if self.schedule not in ("cosine", "trapezoid"):
            raise ValueError(f"schedule must be cosine or trapezoid, got {self.schedule!r}")
        if self.loader not in ("auto", "datamix", "stream"):
            raise ValueError(f"loader must be auto, datamix or stream, got {self.loader!r}")
        if self.steps <= 0 or self.batch_size <= 0 or self.seq_len <= 0:
            raise ValueError("steps, batch_size and seq_len must be positive")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine decay
    to ``min_lr_frac * lr`` or a trapezoid (constant, then linear decay over the last
    ``cooldown_frac`` of the steps, as in warmup-stable-decay schedules)."""
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
# data
# ----------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One rank's micro-batch: ``inputs``/``targets`` ``int64 [B, T]``."""

    inputs: torch.Tensor
    targets: torch.Tensor


def _shard_paths(manifest_path: str, split: str) -> tuple[list[Path], Any]:
    m = load_manifest(manifest_path)
    root = Path(manifest_path)
    root = root if root.is_dir() else root.parent
    paths = [root / s.path for s in m.shards(split)]
    if not paths:
        raise ValueError(f"{manifest_path}: no {split} shards in the manifest")
    return paths, m


class StreamLoader:
    """Fixed-length windows at seeded random offsets in the concatenated shards of one split.

    Global step ``s`` draws ``world * B`` window starts uniformly (with replacement) from
    ``numpy.random.default_rng([seed, s])`` over the concatenated token stream; each window is
    ``T + 1`` tokens (inputs and targets shifted by one) and rank ``r`` gets windows
    ``r*B .. (r+1)*B``. Every source thus appears in proportion to its tokens, batches do not
    depend on the world size's split, and the state is just ``{"step"}``: exactly resumable.
    Windows may start mid-document (EOT tokens separate documents); the datamix loader gives
    document-aligned sequences with the manifest's mixture weights.
    """

    def __init__(self, shards: list[Path], batch_size: int, seq_len: int,
                 rank: int = 0, world: int = 1, seed: int = 0) -> None:
        self.arrays = [read_tokens(p) for p in shards]
        self.sizes = np.array([len(a) for a in self.arrays], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])
        self.total = int(self.starts[-1])
        self.b, self.t, self.rank, self.world, self.seed = batch_size, seq_len, rank, world, seed
        if seq_len + 1 > self.total:
            raise ValueError(f"a sequence needs {seq_len + 1} tokens but the shards hold "
                             f"{self.total} ({shards[0]} ...)")
        self.step = 0

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens ``[start, start + n)`` of the concatenated stream as int64."""
        out = np.empty(n, dtype=np.int64)
        i = int(np.searchsorted(self.starts, start, side="right") - 1)
        done = 0
        while done < n:
            off = start + done - int(self.starts[i])
            take = min(n - done, int(self.sizes[i]) - off)
            out[done : done + take] = self.arrays[i][off : off + take]
            done += take
            i += 1
        return out

    def global_windows(self, step: int) -> np.ndarray:
        """All ranks' windows of global step ``step``: ``int64 [world*B, T + 1]``."""
        rng = np.random.default_rng([self.seed, step])
        offs = rng.integers(0, self.total - self.t, size=self.world * self.b)
        return np.stack([self.read(int(o), self.t + 1) for o in offs])

    def next_batch(self) -> Batch:
        w = torch.from_numpy(self.global_windows(self.step)[self.rank * self.b :
                                                            (self.rank + 1) * self.b])
        self.step += 1
        return Batch(w[:, :-1].contiguous(), w[:, 1:].contiguous())

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def make_train_loader(cfg: TrainConfig, rank: int, world: int):
    """The datamix loader for training datamix manifests (when installed), else
    :class:`StreamLoader`. Returns an object with ``next_batch()``, ``state_dict()`` and
    ``load_state_dict()``."""
    manifest = json.loads(_manifest_file(cfg.data).read_text())
    is_curation = manifest.get("kind") == "curation"
    want = cfg.loader
    if want == "auto":
        want = "stream" if is_curation else "datamix"
    if want == "datamix":
        try:
            from tokenmill.train import data as datamix  # noqa: F401
        except ModuleNotFoundError as e:
            raise RuntimeError(
                "loader=datamix needs tokenmill.train.data (the datamix loader), not installed"
            ) from e
        return _DatamixAdapter(cfg, rank, world)
    paths, _ = _shard_paths(cfg.data, "train")
    return StreamLoader(paths, cfg.batch_size, cfg.seq_len, rank, world, cfg.seed)


def _manifest_file(path: str) -> Path:
    p = Path(path)
    return p / "manifest.json" if p.is_dir() else p


class _DatamixAdapter:
    """Adapts :mod:`tokenmill.train.data` to ``next_batch()`` (inputs/targets)."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int) -> None:
        from tokenmill.train import data as datamix

        self.loader = datamix.DatamixLoader(
            cfg.data, batch_size=cfg.batch_size, seq_len=cfg.seq_len, rank=rank,
            world_size=world, seed=cfg.seed,
        )

    def next_batch(self) -> Batch:
        b = self.loader.next_batch()
        x = torch.as_tensor(np.asarray(b.inputs), dtype=torch.long)
        y = torch.as_tensor(np.asarray(b.targets), dtype=torch.long)
        return Batch(x, y)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


def validation_set(cfg: TrainConfig) -> torch.Tensor:
    """The fixed validation sequences ``int64 [Nv, seq_len + 1]``: ``Nv = val_tokens //
    seq_len`` windows (at least one) evenly spaced over the val shards in manifest order, so
    every val source is represented in proportion to its tokens."""
    paths, _ = _shard_paths(cfg.data, "val")
    s = StreamLoader(paths, 1, cfg.seq_len)
    n = max(1, min(cfg.val_tokens, s.total - 1) // cfg.seq_len)
    offs = np.linspace(0, s.total - cfg.seq_len - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([s.read(int(o), cfg.seq_len + 1) for o in offs]))


# ----------------------------------------------------------------------------------------------
# side inputs
# ----------------------------------------------------------------------------------------------


def prefix_array(encoding_name: str) -> np.ndarray:
    """``int32 [n_vocab]``: the token whose bytes are the longest proper prefix of each
    token's bytes, -1 if none. Uses :class:`tokenmill.tokenizers.prefix.PrefixMap` when
    installed; otherwise computes the same definition directly from the tiktoken ranks."""
    try:
        from tokenmill.tokenizers.prefix import PrefixMap
    except ModuleNotFoundError:
        PrefixMap = None
    if PrefixMap is not None:
        pm = PrefixMap(encoding_name) if not hasattr(PrefixMap, "build") else (
            PrefixMap.build(encoding_name))
        arr = getattr(pm, "array", None)
        if arr is None:
            arr = getattr(pm, "prefix_ids", None)
        if arr is not None:
            return np.asarray(arr, dtype=np.int32)
    from tokenmill.tokenizers import get_encoding

    enc = get_encoding(encoding_name)
    out = np.full(enc.n_vocab, -1, dtype=np.int32)
    ranks = enc._mergeable_ranks  # bytes -> id
    for tok, tid in ranks.items():
        for cut in range(len(tok) - 1, 0, -1):
            p = ranks.get(tok[:cut])
            if p is not None:
                out[tid] = p
                break
    return out


def load_mask_bits(path: str, n_vocab: int, encoding_name: str | None = None) -> torch.Tensor:
    """Packed legality rows ``uint8 [n_vocab, ceil(n_vocab/8)]`` (LSB-first) from a ``.npy``
    file or a :class:`tokenmill.tokenizers.legality.LegalityTable` file/folder."""
    p = Path(path)
    if p.suffix == ".npy":
        bits = np.load(p, mmap_mode="r")
    else:
        from tokenmill.tokenizers.legality import LegalityTable

        table = LegalityTable.load(p)
        bits = getattr(table, "packed", None)
        if bits is None:
            bits = table.packed_rows()
        if encoding_name is not None:
            name = getattr(getattr(table, "identity", None), "name", encoding_name)
            if name != encoding_name:
                raise ValueError(f"{p}: legality table is for {name}, data is {encoding_name}")
    bits = np.ascontiguousarray(bits, dtype=np.uint8)
    need = (n_vocab + 7) // 8
    if bits.ndim != 2 or bits.shape[0] < n_vocab or bits.shape[1] < need:
        raise ValueError(
            f"{p}: legality rows have shape {bits.shape}, need at least ({n_vocab}, {need})"
        )
    return torch.from_numpy(bits)


class LEMFeed:
    """Trainer side of the LEM predictor: :class:`tokenmill.ngram.LEMStream` running in its
    own process over the same loader order, ``lem_ahead`` slots ahead.

    ``get(step)`` returns this rank's ``(match_len int [B, T], candidates int [B, T, K])`` and
    accumulates ``wait_s`` (time the trainer blocked on the predictor); ``lag`` is how many
    steps the producer is ahead (negative = behind).
    """

    def __init__(self, cfg: TrainConfig, rank: int, world: int, make_loader: Callable) -> None:
        try:
            from tokenmill.ngram import LEMStream
        except ImportError as e:
            raise RuntimeError(
                "lem=true needs tokenmill.ngram.LEMStream (the online predictor), not installed"
            ) from e
        self.rank, self.b = rank, cfg.batch_size
        self.stream = LEMStream(
            make_loader=make_loader, k=cfg.lem_k, ahead=cfg.lem_ahead, window=cfg.lem_window,
            rank=rank, world_size=world, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
        )
        self.wait_s = 0.0

    def start(self, step: int) -> None:
        self.stream.start(step)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        match_len, cand = self.stream.get(step)
        self.wait_s += time.perf_counter() - t0
        return torch.as_tensor(match_len), torch.as_tensor(cand)

    @property
    def lag(self) -> int:
        return int(getattr(self.stream, "lag", 0))

    def close(self) -> None:
        self.stream.close()


def lem_for_sequences(seqs: np.ndarray, k: int, window: int | None) -> tuple[np.ndarray, ...]:
    """LEM side input for fixed sequences (validation): the online predictor run inline over
    the concatenated ``seqs[:, :-1]`` in order, per-position causality. Returns
    ``(match_len [Nv, T], candidates [Nv, T, k])``."""
    from tokenmill import ngram

    flat = np.ascontiguousarray(seqs[:, :-1]).reshape(-1)
    pred = ngram.OnlineLEM(k=k, window=window) if window else ngram.OnlineLEM(k=k)
    ml, cand = pred.update(flat)
    n, t = seqs.shape[0], seqs.shape[1] - 1
    return np.asarray(ml).reshape(n, t), np.asarray(cand).reshape(n, t, k)


# ----------------------------------------------------------------------------------------------
# distributed
# ----------------------------------------------------------------------------------------------


def _dist_env() -> tuple[int, int, int]:
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def _peak_flops(device: torch.device, cfg: TrainConfig) -> float:
    if cfg.peak_flops > 0:
        return cfg.peak_flops
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    table = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12}
    return next((v for k, v in table.items() if k in name), 0.0)


# ----------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What a run returns (also written to ``out_dir/metrics.json``)."""

    out_dir: str
    steps_done: int
    train_loss: list[tuple[int, float]]
    val: list[dict[str, float]]
    tokens_per_s: float
    lem_wait_frac: float
    wall_s: float
    mfu: float = float("nan")
    stopped_early: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _checkpoint_path(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:07d}.pt"


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    ck = sorted((Path(out_dir) / "checkpoints").glob("step_*.pt"))
    return ck[-1] if ck else None


@torch.no_grad()
def evaluate(
    model: GPT,
    val: torch.Tensor,
    device: torch.device,
    batch_size: int,
    autocast,
    mask_bits: torch.Tensor | None = None,
    lem: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, float]:
    """Mean validation loss (nats/token) without and with the legality mask, and the number
    of val targets the mask marks impossible (``masked_targets``, 0 for a sound table)."""
    was = model.training
    model.eval()
    tot, tot_m, n, bad = 0.0, 0.0, 0, 0
    for i in range(0, val.shape[0], batch_size):
        seq = val[i : i + batch_size].to(device)
        x, y = seq[:, :-1], seq[:, 1:]
        kw = {}
        if lem is not None:
            kw = dict(lem_len=torch.as_tensor(lem[0][i : i + batch_size]).to(device),
                      lem_cand=torch.as_tensor(lem[1][i : i + batch_size]).to(device))
        with autocast():
            tot += float(model(x, y, reduction="sum", **kw))
            if mask_bits is not None:
                tot_m += float(model(x, y, reduction="sum", mask_bits=mask_bits, **kw))
                bad += masked_target_count(y.reshape(-1), x.reshape(-1), mask_bits)
        n += y.numel()
    model.train(was)
    out = {"val_loss": tot / n}
    if mask_bits is not None:
        out.update(val_loss_masked=tot_m / n, masked_targets=float(bad))
    return out


def train(cfg: TrainConfig, resume: bool = False) -> RunResult:
    """Run (or resume) training; see the module docstring. Returns a :class:`RunResult`.

    Raises:
        ValueError: bad config or data (message names the file/key).
        RuntimeError: an optional component (datamix loader, LEMStream, legality table) is
            asked for but not installed.
    """
    cfg.validate()
    rank, world, local_rank = _dist_env()
    ddp = world > 1
    if cfg.device == "auto":
        dev_type = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        dev_type = cfg.device
    device = torch.device(dev_type, local_rank) if dev_type == "cuda" else torch.device("cpu")
    if dev_type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if ddp and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev_type == "cuda" else "gloo")
    if cfg.num_threads and dev_type == "cpu":
        torch.set_num_threads(cfg.num_threads)
    master = rank == 0
    out = Path(cfg.out_dir)
    if master:
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps(asdict(cfg), indent=2) + "\n")

    # data and tokenizer
    _, manifest = _shard_paths(cfg.data, "val")
    ident = manifest.tokenizer
    train_loader = make_train_loader(cfg, rank, world)
    val = validation_set(cfg)
    mask_bits = (load_mask_bits(cfg.legality, ident.n_vocab, ident.name).to(device)
                 if cfg.legality else None)
    prefix = (torch.from_numpy(prefix_array(ident.name)).long().to(device)
              if cfg.prefix_aux_weight > 0 else None)

    # model and optimizer (same init on every rank: same seed)
    torch.manual_seed(cfg.seed)
    mcfg = GPTConfig.preset(cfg.model, vocab_size=ident.n_vocab, max_seq_len=cfg.seq_len,
                            lem=cfg.lem, lem_k=cfg.lem_k, **cfg.model_overrides)
    model = GPT(mcfg).to(device)
    opt = model.configure_optimizer(cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    start_step = 0
    history: list[tuple[int, float]] = []
    val_hist: list[dict[str, float]] = []
    if resume:
        ck = latest_checkpoint(out)
        if ck is None:
            raise ValueError(f"--resume: no checkpoint under {out / 'checkpoints'}")
        state = torch.load(ck, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        train_loader.load_state_dict(state["loader"][rank] if world > 1 else state["loader"][0])
        torch.set_rng_state(state["rng_cpu"])
        np.random.set_state(state["rng_numpy"])
        start_step = int(state["step"])
        history = [tuple(h) for h in state["history"]]
        val_hist = list(state["val"])
    run_model = model
    if cfg.compile:
        run_model = torch.compile(model)
    if ddp:
        run_model = torch.nn.parallel.DistributedDataParallel(
            run_model, device_ids=[local_rank] if dev_type == "cuda" else None)
    autocast = (
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev_type == "cuda"
        else nullcontext
    )

    lem_feed = None
    val_lem = None
    if cfg.lem:
        if cfg.grad_accum != 1:
            raise ValueError("lem=true supports grad_accum=1 only")
        lem_feed = LEMFeed(cfg, rank, world, lambda: make_train_loader(cfg, rank, world))
        lem_feed.start(start_step)
        val_lem = lem_for_sequences(val.numpy(), cfg.lem_k, cfg.lem_window)

    def _eval() -> dict[str, float]:
        return evaluate(model, val, device, cfg.batch_size, autocast, mask_bits, val_lem)

    def _save(step: int) -> None:
        loaders = [train_loader.state_dict()]
        if ddp:
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, train_loader.state_dict())
            loaders = gathered
        if not master:
            return
        state = {
            "step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "loader": loaders, "rng_cpu": torch.get_rng_state(),
            "rng_numpy": np.random.get_state(), "history": history, "val": val_hist,
            "config": asdict(cfg), "model_config": mcfg.to_dict(),
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(_checkpoint_path(out, step), buf.getvalue())

    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum * world
    flops_tok = model.flops_per_token(cfg.seq_len)
    peak = _peak_flops(device, cfg)
    bar = None
    if master and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start_step, desc="train", unit="step")
    if start_step == 0 and cfg.val_every > 0:
        val_hist.append({"step": 0, **_eval()})
    t_start = time.perf_counter()
    t_steps = 0.0
    n_timed = 0
    step = start_step
    stopped = False
    try:
        while step < cfg.steps:
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            loss_acc = 0.0
            for micro in range(cfg.grad_accum):
                batch = train_loader.next_batch()
                x = batch.inputs.to(device, non_blocking=True)
                y = batch.targets.to(device, non_blocking=True)
                kw: dict[str, Any] = {}
                if prefix is not None:
                    kw.update(aux_targets=prefix[y], aux_weight=cfg.prefix_aux_weight)
                if lem_feed is not None:
                    ml, cand = lem_feed.get(step)
                    kw.update(lem_len=ml.to(device), lem_cand=cand.to(device))
                sync = (not ddp or micro == cfg.grad_accum - 1)
                ctx = nullcontext() if sync else run_model.no_sync()
                with ctx:
                    with autocast():
                        loss = run_model(x, y, **kw) / cfg.grad_accum
                    loss.backward()
                loss_acc += float(loss.detach())
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if ddp:
                t = torch.tensor([loss_acc], device=device)
                torch.distributed.all_reduce(t)
                loss_acc = float(t) / world
            history.append((step, loss_acc))
            dt = time.perf_counter() - t0
            if step > start_step + 1:  # the first step includes warm-up costs
                t_steps += dt
                n_timed += 1
            if bar is not None:
                post = {"loss": f"{loss_acc:.3f}", "lr": f"{lr:.2e}",
                        "tok/s": f"{tokens_per_step / max(dt, 1e-9):,.0f}"}
                if lem_feed is not None:
                    post["lem_lag"] = lem_feed.lag
                bar.set_postfix(post)
                bar.update(1)
            if cfg.val_every > 0 and (step % cfg.val_every == 0 or step == cfg.steps):
                val_hist.append({"step": step, **_eval()})
                if bar is not None:
                    bar.write(f"step {step}: " + ", ".join(
                        f"{k}={v:.4f}" for k, v in val_hist[-1].items() if k != "step"))
            if cfg.ckpt_every > 0 and step % cfg.ckpt_every == 0 and step < cfg.steps:
                _save(step)
            if cfg.stop_after is not None and step >= cfg.stop_after and step < cfg.steps:
                _save(step)
                stopped = True
                break
        if not stopped:
            _save(step)
    finally:
        if bar is not None:
            bar.close()
        if lem_feed is not None:
            lem_feed.close()
    wall = time.perf_counter() - t_start
    tps = tokens_per_step * n_timed / t_steps if t_steps > 0 else float("nan")
    mfu = flops_tok * tps / (peak * world) if peak > 0 else float("nan")
    lem_frac = (lem_feed.wait_s / wall) if (lem_feed is not None and wall > 0) else 0.0
    result = RunResult(str(out), step, history, val_hist, tps, lem_frac, wall, mfu, stopped)
    if master:
        atomic_write_text(out / "metrics.json", result.to_json())
        if not stopped:
            plot_losses(result, out / "loss.png")
        print(summary_table(result))
    if ddp:
        torch.distributed.barrier()
    return result


def summary_table(r: RunResult) -> str:
    last = r.val[-1] if r.val else {}
    first = r.val[0] if r.val else {}
    rows = [
        ("steps", f"{r.steps_done}"),
        ("train loss (last)", f"{r.train_loss[-1][1]:.4f}" if r.train_loss else "-"),
        ("val loss (first -> last)",
         f"{first.get('val_loss', float('nan')):.4f} -> {last.get('val_loss', float('nan')):.4f}"),
        ("val loss masked (last)", f"{last.get('val_loss_masked', float('nan')):.4f}"),
        ("masked val targets", f"{int(last.get('masked_targets', 0))}"),
        ("tokens/s", f"{r.tokens_per_s:,.0f}"),
        ("MFU", f"{r.mfu:.1%}" if math.isfinite(r.mfu) else "-"),
        ("LEM wait / wall", f"{r.lem_wait_frac:.1%}"),
        ("wall s", f"{r.wall_s:.1f}"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def plot_losses(r: RunResult, path: Path) -> None:
    """Train loss per step and val loss (unmasked / masked) per evaluation, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if r.train_loss:
        s, l = zip(*r.train_loss, strict=True)
        ax.plot(s, l, lw=0.8, alpha=0.7, label="train")
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
    atomic_write_bytes(path, buf.getvalue())
