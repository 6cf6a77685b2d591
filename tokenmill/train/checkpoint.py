"""Checkpoints that resume exactly, written atomically and rotated.

A checkpoint ``OUT/checkpoints/step_NNNNNNN.pt`` holds the model, optimizer, step, every
rank's loader state, the CPU and numpy RNG states, the loss history and the config: a run
resumed from it reproduces the uninterrupted losses bit for bit on CPU. After each save only
the newest ``keep`` checkpoints stay (``keep_checkpoints`` in the config, 0 = all).

A checkpoint is someone else's file once it is copied or downloaded: it is read with
``torch.load(weights_only=True)``, which unpickles tensors and plain values only (dict,
list, tuple, str, int, float, bool, None) and never runs code a file holds. What is not a
tensor or a plain value (numpy arrays and scalars: the numpy RNG state) is saved as a tensor
tagged with its dtype, and turned back on load. A checkpoint that needs more than this to
load is refused in one line.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
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
    torch.save(_plain(state), buf)
    path = checkpoint_path(out_dir, step)
    stale = sorted({*list_checkpoints(out_dir), path})[:-keep] if keep > 0 else []
    atomic_write_bytes(path, buf.getvalue())
    for old in stale:  # deleted only once the new one is written
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | os.PathLike, device: torch.device) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors onto ``device``).

    Raises:
        ValueError: one line naming ``path`` when it holds anything but tensors and plain
            values (a pickle that would run code, a checkpoint of an older format that
            pickled numpy objects) or is not a checkpoint at all.
    """
    try:
        with warnings.catch_warnings():  # torch warns about the protocol of foreign pickles
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError,
            ImportError, TypeError, KeyError, IndexError) as e:
        why = " ".join(str(e).split())[:160]
        if isinstance(e, pickle.UnpicklingError):
            why = _refused_global(str(e))
        raise ValueError(f"{path}: refused: not a checkpoint that loads as tensors and plain "
                         f"values only ({why})") from None
    return _unplain(state)


def _refused_global(message: str) -> str:
    """The global (``module.name``) torch's weights-only unpickler refused, in words."""
    for line in message.splitlines():
        if "Unsupported global" in line:
            return "it holds objects that load only by running code: " + " ".join(
                line.split())[:120]
    return "it holds objects that load only by running code"


_NDARRAY = "__tokenmill_ndarray__"


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars replaced by tensors and Python numbers, so
    that ``torch.load(weights_only=True)`` reads it back (see :func:`_unplain`)."""
    if isinstance(value, np.ndarray):
        native = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
        return {_NDARRAY: torch.from_numpy(native.reshape(-1).view(np.uint8).copy()),
                "dtype": native.dtype.str, "shape": list(native.shape)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return type(value)((k, _plain(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _unplain(value: Any) -> Any:
    """The inverse of :func:`_plain`: tagged byte tensors back into numpy arrays."""
    if isinstance(value, dict):
        if _NDARRAY in value:
            raw = value[_NDARRAY].cpu().numpy().tobytes()
            return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(
                value["shape"]).copy()
        return type(value)((k, _unplain(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_unplain(v) for v in value)
    return value
