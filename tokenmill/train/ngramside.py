"""The trainer's n-gram side input: the interpolated n-gram model's top-``m`` next-token
candidates and log-probabilities per position, read in lockstep with the tokens.

The side channel is made before the run by ``tokenmill ngram features MIX -o DIR``
(:mod:`tokenmill.ngram.ngramfeat`; format: ``ngram.json`` plus ``ngram_cand_NNNNNN.npy``
``[n, m]`` and ``ngram_logp_NNNNNN.npy`` ``[n, m]`` float16 per file). Position ``p`` of the
files is position ``p`` of the MixLoader stream of the mix (rows of ``seq_len + 1`` tokens
back to back, global rows per step): the LEM side channel's alignment, so
:class:`NgramSideChannel` reads by the loader's global step like
:class:`tokenmill.train.lemside.LEMSideChannel` (resume, any ``grad_accum``, any number of
ranks: the same global features). The counts behind a position never include its own next
token or anything after it (the producer's chunk rule); validation positions get counts from
training data only (:func:`ngram_for_validation`).

The reading shared with the LEM side channel (meta file, binding to the mix, stream
geometry, contiguous sha256-verified ``.npy`` files) is :mod:`tokenmill.train.side`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.train.batches import TrainData
from tokenmill.train.config import TrainConfig
from tokenmill.train.side import (
    SideFiles,
    check_mix_listing,
    check_stream_binding,
    rank_rows,
    rank_span,
    read_side_meta,
)

NGRAM_META = "ngram.json"
NGRAM_KIND = "ngram-side-channel"
MAKE_NGRAM = "`tokenmill ngram features MIX -o DIR`"
#: floor of the log-probabilities handed to the model (float16 files may hold -inf)
LOGP_FLOOR = -30.0


class NgramSideChannelError(ValueError):
    """An n-gram side channel that does not belong to this run, or a file of it that cannot
    be trusted (one line naming the file)."""


def decode_ngram(cand: np.ndarray, logp: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """File values to model inputs: ``cand`` (uint16 with 65,535 = none, or int32 with -1)
    and float16 ``logp`` ``[..., m_file]`` -> ``(int32 [..., m] with -1 = none, float32
    [..., m])``; a none candidate's log-probability is 0 and the others are finite (clipped
    at :data:`LOGP_FLOOR`), so a gate times them is never NaN."""
    c = cand[..., :m]
    c = np.where(c == 65535, -1, c.astype(np.int32)) if c.dtype == np.uint16 else \
        c.astype(np.int32)
    lp = np.nan_to_num(logp[..., :m].astype(np.float32), nan=LOGP_FLOOR, neginf=LOGP_FLOOR)
    lp = np.where(c >= 0, np.clip(lp, LOGP_FLOOR, 0.0), 0.0).astype(np.float32)
    return c, lp


def open_ngram_files(folder: str | Path, data: TrainData, ngram_m: int | None, *, split: str,
                     verify: bool) -> tuple[Path, dict, SideFiles, int]:
    """Check and open an n-gram side channel of ``split``: ``(meta path, meta, files, m)``
    with ``m`` the run's ``ngram_m`` (``None``: the file's). The train split's stream depends
    on the global rows per step; the val split's (read once in manifest order, without
    shuffling) does not.

    Raises:
        NgramSideChannelError: see :func:`~tokenmill.train.side.check_stream_binding` and
            :class:`~tokenmill.train.side.SideFiles`; an ``m`` below ``ngram_m``; when the
            mix manifest lists the side channel, a file differing from that listing
            (:func:`tokenmill.train.side.check_mix_listing`).
    """
    err = NgramSideChannelError
    option = "ngram_features" if split == "train" else "ngram_val_features"
    meta_path, meta = read_side_meta(folder, NGRAM_META, NGRAM_KIND, MAKE_NGRAM, err)
    want = {"split": split, **({"batch_size": data.global_rows} if split == "train" else {})}
    check_stream_binding(meta_path, meta, data, want, option=option, err=err)
    fm = meta.get("m")
    if not isinstance(fm, int) or fm < 1 or (ngram_m is not None and fm < ngram_m):
        raise err(f"{meta_path}: m is {fm!r}, the run's ngram_m is {ngram_m}")
    checked = check_mix_listing(meta_path, data, verify, err)
    files = SideFiles(meta_path, meta, {"cand": ((fm,), "iu"), "logp": ((fm,), "f")},
                      verify, err, checked)
    return meta_path, meta, files, ngram_m or fm


class NgramSideChannel:
    """Precomputed n-gram features read in lockstep with the tokens (the alignment of
    :class:`tokenmill.train.lemside.LEMSideChannel`: this rank's rows of each global step,
    :func:`tokenmill.train.side.rank_span`, each row's first ``T`` positions).

    ``get(step)`` returns ``(candidates int32 [B, T, m] (-1 = none), logp float32 [B, T,
    m])`` (:func:`decode_ngram`) and accumulates ``wait_s``.

    Raises (at construction):
        NgramSideChannelError: see :func:`open_ngram_files`; a stream shorter than the run's
            steps.
    """

    key, names = "ngram", ("ngram_cand", "ngram_logp")
    lag = 0
    mean_lag = float("nan")

    @classmethod
    def from_config(cls, data: TrainData, cfg: TrainConfig) -> NgramSideChannel | None:
        """The side channel ``ngram_features`` names (checked; files hashed unless
        ``verify: false``)."""
        if cfg.ngram_features is None:
            return None
        return cls(cfg.ngram_features, data, cfg, verify=cfg.verify)

    def __init__(self, folder: str | Path, data: TrainData, cfg: TrainConfig,
                 verify: bool = True) -> None:
        self.meta_path, self.meta, self.files, self.m = open_ngram_files(
            folder, data, cfg.ngram_m, split="train", verify=verify)
        steps = cfg.steps * cfg.grad_accum
        self.files.check_covers(steps * data.global_rows * data.row_tokens,
                                f"the run's {steps} steps")
        self.data, self.verify = data, verify
        self.ngram_m, self.val_folder = cfg.ngram_m, cfg.ngram_val_features
        self.wait_s = 0.0

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of the loader's global step ``step``."""
        t0 = time.perf_counter()
        lo, hi = rank_span(self.data, step)
        cand, logp = decode_ngram(self.files.read("cand", lo, hi),
                                  self.files.read("logp", lo, hi), self.m)
        out = rank_rows(self.data, cand), rank_rows(self.data, logp)
        self.wait_s += time.perf_counter() - t0
        return out

    def for_validation(self, val: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """:func:`ngram_for_validation` of the run's ``ngram_val_features``."""
        return ngram_for_validation(val, self, self.val_folder)

    def skip_to(self, step: int) -> None:
        """Nothing to replay: features are read by step."""

    def close(self) -> None:
        """Nothing to stop (the files are memory-mapped)."""


def ngram_for_validation(val: torch.Tensor, feed: NgramSideChannel,
                         val_folder: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """N-gram features of the fixed validation rows (``int64 [Nv, T + 1]``) from training
    data only: read from ``val_folder`` (a ``--split val`` side channel: the val split is
    read once in manifest order without shuffling, so its stream of rows is the same for
    any batch size, and :meth:`~tokenmill.train.batches.TrainData.validation_rows` are its
    first ``Nv`` rows, back to back), or else computed now with
    :func:`tokenmill.ngram.ngramfeat.precompute_ngram` over the rows with the whole
    training stream as ``history`` (one chunk: counts of the history only, never of val
    tokens) and the train side channel's orders, beta and m (``ngram features --split val``
    does the same).

    Returns:
        ``(candidates int32 [Nv, T, m], logp float32 [Nv, T, m])``.

    Raises:
        NgramSideChannelError: the val side channel does not belong to the run, or is
            shorter than the validation rows.
    """
    nv, w = val.shape
    data = feed.data
    if val_folder is not None:
        _, _, files, _ = open_ngram_files(val_folder, data, feed.ngram_m, split="val",
                                          verify=feed.verify)
        files.check_covers(nv * w, f"the {nv} validation rows")
        cand, logp = files.read("cand", 0, nv * w), files.read("logp", 0, nv * w)
    else:
        from tokenmill.ngram.ngramfeat import precompute_ngram

        meta = feed.meta
        history = data.stream_prefix(int(meta["tokens"]))
        cand, logp = precompute_ngram(  # one chunk: counts of the history only
            val.numpy().astype(np.int32).reshape(-1), orders=list(meta["orders"]),
            m=int(meta["m"]), chunk_tokens=None, beta=float(meta["beta"]),
            eot=int(meta["eot"]), n_vocab=data.tokenizer.n_vocab, history=history)
    cand, logp = decode_ngram(np.asarray(cand), np.asarray(logp), feed.m)
    return (np.ascontiguousarray(cand.reshape(nv, w, -1)[:, :-1]),
            np.ascontiguousarray(logp.reshape(nv, w, -1)[:, :-1]))
