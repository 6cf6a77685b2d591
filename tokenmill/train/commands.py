"""CLI: ``tokenmill train CONFIG`` (single process, or under ``torchrun`` for data parallel)."""

from __future__ import annotations

import argparse

from tokenmill.cliargs import add_output_argument, add_quiet_argument

TRAIN_EXTRA_LINE = ("tokenmill train needs torch and triton ({missing} is not installed): "
                    "pip install 'tokenmill[train]'")


def require_train_extra() -> None:
    """Raise ``RuntimeError`` (one line naming the ``train`` extra) without torch or triton."""
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(TRAIN_EXTRA_LINE.format(missing=e.name or "torch")) from None


def _train(args: argparse.Namespace) -> int:
    require_train_extra()
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.train import train

    cfg = TrainConfig.load(
        args.config, steps=args.steps, out_dir=args.out, device=args.device,
        stop_after=args.stop_after, keep_checkpoints=args.keep_checkpoints,
        verify=False if args.no_verify else None,
        progress=False if args.no_progress else None,
    )
    train(cfg, resume=args.resume)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``tokenmill train``."""
    p = sub.add_parser(
        "train",
        help="train the reference GPT on a mix or curation manifest (torchrun for several GPUs)",
        description="Train the reference GPT described by CONFIG (YAML or JSON, the fields of "
        "tokenmill.train.config.TrainConfig). Under torchrun, each rank trains on its part of "
        "every step (DDP).",
    )
    p.add_argument("config", help="train config, YAML or JSON")
    add_output_argument(p, dest="out", help="output folder (overrides the config's out_dir)",
                        aliases=("--out",))
    p.add_argument("--steps", type=int, default=None, help="override the number of steps")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop after this step with a checkpoint (resume later with --resume)")
    p.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    p.add_argument("--keep-checkpoints", type=int, default=None, metavar="N",
                   help="keep the newest N checkpoints (0 = all; default: the config's, 3)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not check the shards' sha256 against the manifest (printed)")
    add_quiet_argument(p, dest="no_progress", help="no progress bar",
                       aliases=("--no-progress",))
    p.set_defaults(func=_train)
