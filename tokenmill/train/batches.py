"""The trainer's data: one loader for both kinds of manifest, and the validation rows.

There is one loader, :class:`tokenmill.train.data.MixLoader`: document-aligned rows (each
starts at a document's EOT token and packs whole documents), one pass over the data in a
seeded order, no replacement (a source is repeated only where the mix grants it more than
one epoch). A training-mix manifest (``tokenmill mix build``) is read as built; a curation
manifest (``tokenmill run``) is read through :meth:`MixLoader.from_curation`, a mix of all its
sources at their mixture weights for one epoch. Shards are opened through the one verified
path (:func:`tokenmill.manifests.verify.open_shards`: sha256 against the manifest) unless the
config says ``verify: false``.

A step's global batch is ``batch_size * world`` rows; rank ``r`` gets rows
``[r * batch_size, (r + 1) * batch_size)``, so the union over ranks is the single-process
stream with the same global batch.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import torch

from tokenmill.manifests.verify import manifest_file, read_manifest
from tokenmill.tokenizers import TokenizerIdentity
from tokenmill.train.config import TrainConfig
from tokenmill.train.data import MixLoader

Kind = Literal["curation", "training-mix"]


def data_kind(path: str) -> Kind:
    """Which kind of manifest ``path`` (a file, or a folder holding ``manifest.json``) is.

    Raises:
        FileNotFoundError: no manifest there.
        ValueError: not a JSON manifest.
    """
    p = manifest_file(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no manifest (data: must name a mix manifest or a "
                                "curation manifest or its folder)")
    try:
        kind = json.loads(p.read_text(encoding="utf-8")).get("kind", "curation")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise ValueError(f"{p}: not a JSON manifest") from None
    return "training-mix" if kind == "training-mix" else "curation"


def data_tokenizer(path: str) -> TokenizerIdentity:
    """The tokenizer identity a curation or training-mix manifest records."""
    return read_manifest(path, data_kind(path))[1].tokenizer


def open_loader(cfg: TrainConfig, split: Literal["train", "val"] = "train", rank: int = 0,
                world: int = 1, batch_size: int | None = None,
                verify: bool | None = None) -> MixLoader:
    """The :class:`MixLoader` over ``cfg.data`` for ``split``, yielding this rank's
    ``int64 [batch_size, seq_len]`` torch inputs/targets of each global step.

    Args:
        batch_size: rows per rank per step (default ``cfg.batch_size``).
        verify: check shard sha256s (default ``cfg.verify``); helpers that reopen data the
            trainer has already verified pass ``False`` (headers are still checked).

    Raises:
        ShardVerifyError: a shard or the manifest cannot be trusted (one line, the file).
    """
    b = cfg.batch_size if batch_size is None else batch_size
    kw = dict(seq_len=cfg.seq_len, batch_size=b * world, world_size=world, rank=rank,
              split=split, output="torch", verify=cfg.verify if verify is None else verify)
    if data_kind(cfg.data) == "training-mix":
        return MixLoader(manifest_file(cfg.data), **kw)
    return MixLoader.from_curation(manifest_file(cfg.data), seed=cfg.seed, epochs=1.0, **kw)


def check_budget(loader: MixLoader, cfg: TrainConfig, world: int) -> None:
    """Refuse a run that needs more steps than one pass over the data gives.

    Raises:
        ValueError: naming the data, its budget and the steps asked for.
    """
    need = cfg.steps * cfg.grad_accum
    if need > loader.num_steps:
        raise ValueError(
            f"{cfg.data}: the data budget gives {loader.num_steps} steps of "
            f"{cfg.batch_size * world} x {cfg.seq_len + 1} tokens (one pass, no replacement); "
            f"the config asks {need}: lower steps, or build a mix that grants more epochs")


def doc_ids(cu_seqlens: torch.Tensor | np.ndarray, b: int, t: int) -> torch.Tensor:
    """Document index per position ``int32 [b, t]`` from the loader's cumulative segment
    lengths over the flattened rows (``int32 [n_segments + 1]``), for document-masked
    attention (segments never cross rows)."""
    seg = np.zeros(b * t, dtype=np.int32)
    seg[np.asarray(cu_seqlens, dtype=np.int64)[1:-1]] = 1
    return torch.from_numpy(np.cumsum(seg, dtype=np.int32).reshape(b, t))


def validation_set(cfg: TrainConfig, verify: bool | None = None) -> torch.Tensor:
    """The fixed validation rows ``int64 [Nv, seq_len + 1]``: the first ``Nv = max(1,
    val_tokens // seq_len)`` document-aligned rows of the val split (all sources' val
    shards in manifest order, one pass), the same at every evaluation.

    Raises:
        ValueError: the val split holds no row of ``seq_len + 1`` tokens.
    """
    n = max(1, cfg.val_tokens // cfg.seq_len)
    loader = open_loader(cfg, "val", batch_size=1, verify=verify)
    rows = []
    for d in loader:
        rows.append(torch.cat([d["inputs"][0], d["targets"][0, -1:]]))
        if len(rows) == n:
            break
    if not rows:
        raise ValueError(f"{cfg.data}: the val split has no row of {cfg.seq_len + 1} tokens")
    return torch.stack(rows).to(torch.int64)
