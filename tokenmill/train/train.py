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

The config is YAML or JSON with the fields of :class:`TrainConfig`; paths are relative to
the config file. A CPU smoke run on the quickstart output::

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
    legality: gpt2.legality         # optional: masked validation loss

    tokenmill train train-tiny.yaml                 # one process
    tokenmill train train-tiny.yaml --resume        # continue from the latest checkpoint
    torchrun --nproc-per-node 8 -m tokenmill.cli train gpt2.yaml   # data parallel

``batch_size`` is per rank and micro-step; a step is ``batch_size * grad_accum * world``
sequences. The logged train loss includes the prefix auxiliary term when it is on;
validation losses are plain next-token losses (nats/token).
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tokenmill.atomic import atomic_write_bytes, atomic_write_text
from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import read_tokens
from tokenmill.train.kernels import fused_cross_entropy, masked_target_count
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
    lem_window: int | None = None  # predictor memory window (tokens); None = its default
    # cap on the predictor's match length: lengths are bucketed up to 256 anyway, and the
    # cap bounds its work per token inside long runs of a repeated token (O(run**2) without)
    lem_max_len: int = 1024
    loader: str = "auto"  # auto | datamix | stream
    doc_mask: bool = False  # datamix loader: attention stays inside each document
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
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{p}: unknown train config keys {unknown}")
        for key in ("data", "out_dir", "legality"):
            if raw.get(key) and not Path(raw[key]).is_absolute():
                raw[key] = str((p.parent / raw[key]).resolve())
        raw.update({k: v for k, v in overrides.items() if v is not None})  # CLI: cwd-relative
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
    """One rank's micro-batch: ``inputs``/``targets`` ``int64 [B, T]``, optional document
    index per position ``doc_ids int32 [B, T]`` (for document-masked attention)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    doc_ids: torch.Tensor | None = None


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


def _manifest_file(path: str) -> Path:
    p = Path(path)
    return p / "manifest.json" if p.is_dir() else p


def _is_training_mix(path: str) -> bool:
    return json.loads(_manifest_file(path).read_text()).get("kind") == "training-mix"


def data_tokenizer(path: str):
    """The :class:`~tokenmill.tokenizers.TokenizerIdentity` of a curation or training-mix
    manifest."""
    if _is_training_mix(path):
        from tokenmill.manifests.mix import load_mix_manifest

        return load_mix_manifest(_manifest_file(path)).tokenizer
    return load_manifest(path).tokenizer


def make_train_loader(cfg: TrainConfig, rank: int, world: int):
    """:class:`tokenmill.train.data.MixLoader` for a training datamix manifest
    (``tokenmill mix build``), :class:`StreamLoader` for a curation manifest
    (``loader: auto``); either can be forced with ``loader``. Returns an object with
    ``next_batch() -> Batch``, ``state_dict()`` and ``load_state_dict()``."""
    want = cfg.loader
    if want == "auto":
        want = "datamix" if _is_training_mix(cfg.data) else "stream"
    if want == "datamix":
        return _MixAdapter(cfg, rank, world)
    paths, _ = _shard_paths(cfg.data, "train")
    return StreamLoader(paths, cfg.batch_size, cfg.seq_len, rank, world, cfg.seed)


def _doc_ids(cu_seqlens: np.ndarray, b: int, t: int) -> torch.Tensor:
    """Segment index per position ``int32 [b, t]`` from cumulative segment lengths."""
    seg = np.zeros(b * t, dtype=np.int32)
    starts = np.asarray(cu_seqlens[1:-1], dtype=np.int64)
    seg[starts] = 1
    return torch.from_numpy(np.cumsum(seg, dtype=np.int32).reshape(b, t))


class _MixAdapter:
    """:class:`tokenmill.train.data.MixLoader` as a ``next_batch() -> Batch`` source; a
    global batch is ``batch_size * world`` rows, this rank gets its ``batch_size``."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int) -> None:
        try:
            from tokenmill.train.data import MixLoader
        except ModuleNotFoundError as e:
            raise RuntimeError("loader=datamix needs tokenmill.train.data (MixLoader)") from e
        self.loader = MixLoader(cfg.data if not Path(cfg.data).is_dir()
                                else _manifest_file(cfg.data),
                                seq_len=cfg.seq_len, batch_size=cfg.batch_size * world,
                                world_size=world, rank=rank)
        need = cfg.steps * cfg.grad_accum
        if need > self.loader.num_steps:
            raise ValueError(
                f"{cfg.data}: the datamix budget gives {self.loader.num_steps} steps of "
                f"{cfg.batch_size * world} x {cfg.seq_len} tokens; the config asks {need}"
            )
        self.doc_mask = cfg.doc_mask
        self.b, self.t = cfg.batch_size, cfg.seq_len

    def next_batch(self) -> Batch:
        d = self.loader.next_batch()
        x = torch.as_tensor(d["inputs"], dtype=torch.long)
        y = torch.as_tensor(d["targets"], dtype=torch.long)
        doc = _doc_ids(np.asarray(d["cu_seqlens"]), self.b, self.t) if self.doc_mask else None
        return Batch(x, y, doc)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


def validation_set(cfg: TrainConfig) -> torch.Tensor:
    """The fixed validation sequences ``int64 [Nv, seq_len + 1]``, ``Nv = val_tokens //
    seq_len`` (at least one). Curation manifest: windows evenly spaced over the val shards in
    manifest order, so every val source is represented in proportion to its tokens. Training
    datamix: the first ``Nv`` document-aligned rows of ``MixLoader(split="val")``."""
    n = max(1, cfg.val_tokens // cfg.seq_len)
    if _is_training_mix(cfg.data):
        from tokenmill.train.data import MixLoader

        vl = MixLoader(_manifest_file(cfg.data), seq_len=cfg.seq_len, batch_size=1,
                       split="val")
        rows = []
        for d in vl:
            rows.append(np.concatenate([d["inputs"][0], d["targets"][0, -1:]]))
            if len(rows) == n:
                break
        if not rows:
            raise ValueError(f"{cfg.data}: the val split has no row of {cfg.seq_len + 1} tokens")
        return torch.from_numpy(np.stack(rows).astype(np.int64))
    paths, _ = _shard_paths(cfg.data, "val")
    s = StreamLoader(paths, 1, cfg.seq_len)
    n = min(n, max(1, (s.total - 1) // cfg.seq_len))
    offs = np.linspace(0, s.total - cfg.seq_len - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([s.read(int(o), cfg.seq_len + 1) for o in offs]))


# ----------------------------------------------------------------------------------------------
# side inputs
# ----------------------------------------------------------------------------------------------


def prefix_array(encoding_name: str) -> np.ndarray:
    """``int32 [n_vocab]``: the longest proper token prefix of each token, -1 if none
    (:class:`tokenmill.tokenizers.prefix.PrefixMap`), used as the auxiliary target."""
    from tokenmill.tokenizers.prefix import PrefixMap

    return np.asarray(PrefixMap.build(encoding_name).parent, dtype=np.int32)


def load_mask_bits(path: str, n_vocab: int, encoding_name: str | None = None) -> torch.Tensor:
    """Packed legality rows ``uint8 [n_vocab, ceil(n_vocab/8)]`` (LSB-first, 1 = possible)
    from a ``.npy`` file or a :class:`tokenmill.tokenizers.legality.LegalityTable` file or
    folder (checked against ``encoding_name``: another tokenizer's table raises).

    Raises:
        ValueError: the rows do not cover the vocabulary.
    """
    p = Path(path)
    if p.suffix == ".npy":
        bits = np.load(p, mmap_mode="r")
    else:
        from tokenmill.tokenizers.legality import LegalityTable

        bits = LegalityTable.load(p, encoding=encoding_name).packed
    bits = np.array(bits, dtype=np.uint8, order="C")  # a writable in-memory copy
    need = (n_vocab + 7) // 8
    if bits.ndim != 2 or bits.shape[0] < n_vocab or bits.shape[1] < need:
        raise ValueError(
            f"{p}: legality rows have shape {bits.shape}, need at least ({n_vocab}, {need})"
        )
    return torch.from_numpy(bits)


class LEMFeed:
    """Trainer side of the LEM side input: :class:`tokenmill.ngram.stream.LEMStream` runs the
    online predictor (per-step causality: matches only from earlier steps, modded-nanogpt
    PR #367) in its own process over this rank's batches in loader order, up to ``lem_ahead``
    steps ahead.

    Each rank's predictor sees that rank's own stream. On resume the producer replays the
    stream from step 0 (the predictor's history must be the same), and the trainer discards
    the replayed steps, so resumed runs see the same features as uninterrupted ones.

    ``get(step)`` returns ``(match_len int32 [B, T], candidates int32 [B, T, K])`` (copies) and
    accumulates ``wait_s``, the time the trainer blocked on the predictor.
    """

    def __init__(self, cfg: TrainConfig, rank: int, world: int, eot: int) -> None:
        from tokenmill.ngram.stream import LEMStream

        def batches():
            loader = make_train_loader(cfg, rank, world)
            while True:
                yield loader.next_batch().inputs.numpy()

        kw = {"max_len": cfg.lem_max_len}
        if cfg.lem_window is not None:
            kw["window"] = cfg.lem_window
        self.stream = LEMStream(batches(), (cfg.batch_size, cfg.seq_len), eot=eot,
                                k=cfg.lem_k, n_steps=cfg.steps, ahead=cfg.lem_ahead,
                                mode="step", **kw)
        self.wait_s = 0.0

    def skip_to(self, step: int) -> None:
        """Consume (and drop) steps ``0 .. step - 1`` after a resume."""
        for s in range(step):
            self.stream.get(s)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        ml, cand = self.stream.get(step)
        out = torch.from_numpy(ml.copy()), torch.from_numpy(cand.copy())
        self.wait_s += time.perf_counter() - t0
        return out

    @property
    def lag(self) -> int:
        """Steps the producer is ahead of the trainer."""
        return int(self.stream.counters["lag"])

    def close(self) -> None:
        self.stream.close()


def lem_for_validation(cfg: TrainConfig, val: torch.Tensor, eot: int,
                       prime_tokens: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """LEM side input for the fixed validation sequences: an
    :class:`~tokenmill.ngram.lem.OnlineLEM` (per-position causality) primed with the first
    ``prime_tokens`` tokens of the training stream (the first steps' batches of a fresh
    loader), then run over the validation inputs row by row. The same features at every
    evaluation, so validation losses are comparable across steps. Returns
    ``(match_len int32 [Nv, T], candidates int32 [Nv, T, K])``."""
    from tokenmill.ngram.lem import OnlineLEM

    kw = {"max_len": cfg.lem_max_len}
    if cfg.lem_window is not None:
        kw["window"] = cfg.lem_window
    lem = OnlineLEM(eot=eot, k=cfg.lem_k, mode="position", **kw)
    loader = make_train_loader(cfg, 0, 1)
    per = cfg.batch_size * cfg.seq_len
    for _ in range(max(1, min(prime_tokens // per, cfg.steps))):
        lem.step(loader.next_batch().inputs.numpy())
    ml, cand = lem.step(val[:, :-1].numpy())
    return ml.copy(), cand.copy()


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
    ident = data_tokenizer(cfg.data)
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
        lem_feed = LEMFeed(cfg, rank, world, ident.eot_token)
        lem_feed.skip_to(start_step)
        val_lem = lem_for_validation(cfg, val, ident.eot_token)

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
    t_all = 0.0  # every step's time (for the LEM wait share)
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
                if batch.doc_ids is not None:
                    kw["doc_ids"] = batch.doc_ids.to(device)
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
            t_all += dt
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
    lem_frac = (lem_feed.wait_s / t_all) if (lem_feed is not None and t_all > 0) else 0.0
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
        ("LEM wait / step time", f"{r.lem_wait_frac:.1%}"),
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
