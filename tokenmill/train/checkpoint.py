"""Checkpoints that resume exactly, written atomically and rotated.

A checkpoint ``OUT/checkpoints/step_NNNNNNN.pt`` holds the model, optimizer, step, every
rank's loader state, the CPU and numpy RNG states, the loss history and the config: a run
resumed from it reproduces the uninterrupted losses bit for bit on CPU. After each save only
the newest ``keep`` checkpoints stay (``keep_checkpoints`` in the config, 0 = all).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from tokenmill.atomic import atomic_write_bytes


def checkpoint_path(out_dir: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(out_dir) / "checkpoints" / f"step_{step:07d}.pt"


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoints, oldest first."""
    return sorted((Path(out_dir) / "checkpoints").glob("step_*.pt"))


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint, or ``None``."""
    ck = list_checkpoints(out_dir)
    return ck[-1] if ck else None


def save_checkpoint(out_dir: str | os.PathLike, step: int, state: dict[str, Any],
                    keep: int = 0) -> Path:
    """Write ``state`` as the checkpoint of ``step`` (atomically: a crash leaves the old
    one), then delete all but the newest ``keep`` checkpoints (``0`` keeps all)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    path = checkpoint_path(out_dir, step)
    atomic_write_bytes(path, buf.getvalue())
    if keep > 0:
        for old in list_checkpoints(out_dir)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | os.PathLike, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors onto ``device``)."""
    return torch.load(path, map_location=device, weights_only=False)
