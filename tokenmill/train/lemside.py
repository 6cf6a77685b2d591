"""The LEM side input read from a side channel, or from the online predictor's process.

The LEM feature is the causal longest-exact-match predictor's match length and candidate
next tokens, per-position causality (``mode="position"``) in training and validation alike,
over the global training stream (the same features for any number of ranks). Its sources
(each a :class:`tokenmill.train.side.SideInput`):

* :class:`LEMSideChannel` (config ``lem_features``): read from a side channel made before
  the run by ``tokenmill ngram lem``;
* :class:`LEMFeed` (``lem: true`` alone): the online predictor
  (:class:`tokenmill.ngram.stream.LEMStream`) in its own process;
* :class:`tokenmill.train.lemworkers.LEMWorkers` (``lem_workers``): Ray CPU workers.

Validation rows get features made the same way from training history
(:func:`lem_for_validation`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.ngram.precompute import precompute_lem
from tokenmill.ngram.stream import LEMStream
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

LEM_NAMES = ("lem_len", "lem_cand")
DEFAULT_WINDOW = 4_000_000  # the predictor's memory window (tokens) where none is set


class LEMSideChannelError(ValueError):
    """A LEM side channel that does not belong to this run, or a file of it that cannot be
    trusted (one line naming the file)."""


def lem_for_validation(data: TrainData, val: torch.Tensor, *, k: int, window: int,
                       max_len: int, len_cap: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """LEM side input for the fixed validation rows, ahead of time and in position mode, as
    the training features: :func:`tokenmill.ngram.precompute.precompute_lem` over the first
    ``H = window // 2`` tokens of the global training stream (``window = 0``: 4 M) followed
    by the validation rows (``int64 [Nv, T + 1]``) back to back; the validation positions'
    answers are kept. So every validation position sees, causally, at least ``H`` tokens of
    training history (as a training position past the first ``H`` tokens does) plus the
    validation rows before it; nothing of a validation target or after it. The same
    features at every evaluation, so validation losses are comparable across steps.
    ``len_cap``: the side channel's saturation (lengths ``>= len_cap`` read as
    ``len_cap + 1``, as :class:`LEMSideChannel` reads them).

    Returns:
        ``(match_len int32 [Nv, T], candidates int32 [Nv, T, k])``.
    """
    prime = data.stream_prefix((window // 2) if window else DEFAULT_WINDOW)
    rows = val.numpy().astype(np.int32)
    ml, nt = precompute_lem(np.concatenate([prime, rows.reshape(-1)]), k=k, mode="position",
                            window=window, eot=data.tokenizer.eot_token, max_len=max_len)
    nv, w = rows.shape
    ml = ml[prime.size:].reshape(nv, w)[:, :-1]
    nt = nt[prime.size:].reshape(nv, w, k)[:, :-1]
    if len_cap is not None:
        ml = np.where(ml >= len_cap, len_cap + 1, ml).astype(np.int32)
    return np.ascontiguousarray(ml), np.ascontiguousarray(nt)


class LEMFeed:
    """Trainer side of the online LEM side input: :class:`~tokenmill.ngram.stream.LEMStream`
    runs the online predictor (per-position causality, as the side channel and validation)
    in its own process over the global batches (all ranks' rows of ``T + 1`` tokens, loader
    order: the stream of ``tokenmill ngram lem``, so the same features), up to
    ``lem_ahead`` steps ahead of the trainer; :meth:`get` returns this rank's rows of them.
    The features are therefore the same for any number of ranks (each rank's predictor
    reads the whole global stream: ``world`` times the CPU work of one).

    On resume the producer replays the stream from step 0 (the predictor's history must be
    the same), and the trainer discards the replayed steps, so resumed runs see the same
    features as uninterrupted ones.

    ``get(step)`` returns ``(match_len int32 [B, T], candidates int32 [B, T, K])`` (copies)
    and accumulates ``wait_s``, the seconds the trainer blocked on the predictor;
    ``lag`` is how many steps the predictor is ahead (the ``lem_lag`` of the progress bar).
    """

    key, names = "lem", LEM_NAMES

    @classmethod
    def from_config(cls, data: TrainData, cfg: TrainConfig) -> LEMFeed | None:
        """The online predictor when ``lem: true`` names no other LEM source."""
        if not cfg.lem or cfg.lem_features is not None or cfg.lem_workers:
            return None
        return cls(data, cfg)

    def __init__(self, data: TrainData, cfg: TrainConfig) -> None:
        self.data, self.k = data, cfg.lem_k
        self.window, self.max_len = cfg.lem_window, cfg.lem_max_len
        kw = {"max_len": cfg.lem_max_len}
        if cfg.lem_window is not None:
            kw["window"] = cfg.lem_window
        self.stream = LEMStream(data.global_batches(), (data.global_rows, data.row_tokens),
                                eot=data.tokenizer.eot_token, k=cfg.lem_k, n_steps=cfg.steps,
                                ahead=cfg.lem_ahead, mode="position", **kw)
        self.rows = (slice(data.rank * data.rows, (data.rank + 1) * data.rows),
                     slice(0, data.seq_len))
        self.wait_s = 0.0
        self.lag_sum = 0
        self.lag_n = 0

    def skip_to(self, step: int) -> None:
        """Consume (and drop) steps ``0 .. step - 1`` after a resume."""
        for s in range(step):
            self.stream.get(s)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of global step ``step`` (steps are read in order)."""
        t0 = time.perf_counter()
        ml, cand = self.stream.get(step)
        out = (torch.from_numpy(ml[self.rows].copy()),
               torch.from_numpy(cand[self.rows].copy()))
        self.wait_s += time.perf_counter() - t0
        self.lag_sum += self.lag
        self.lag_n += 1
        return out

    def for_validation(self, val: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """:func:`lem_for_validation` with the predictor's window and ``max_len``."""
        return lem_for_validation(self.data, val, k=self.k,
                                  window=self.window or DEFAULT_WINDOW, max_len=self.max_len)

    @property
    def lag(self) -> int:
        """Steps the predictor is ahead of the trainer right now (0: the trainer waits)."""
        return int(self.stream.counters["lag"])

    @property
    def mean_lag(self) -> float:
        """Mean of :attr:`lag` over the steps read so far."""
        return self.lag_sum / self.lag_n if self.lag_n else float("nan")

    def close(self) -> None:
        """Stop the predictor process."""
        self.stream.close()


def check_side_channel(meta_path: Path, meta: dict, data: TrainData, cfg: TrainConfig) -> None:
    """Refuse a LEM side channel made for another mix or another stream geometry.

    The stream the features are aligned with is fixed by the mix manifest (its identity),
    the split, ``seq_len``, the global rows per step (``batch_size * world``: the same
    stream for any split of it into ranks) and the remainder mode; the features by the
    mode, ``k`` (at least ``cfg.lem_k``) and the window.

    Raises:
        LEMSideChannelError: one line naming ``lem.json``, the field, its value and the
            run's.
    """
    err = LEMSideChannelError
    want = {"split": "train", "mode": "position", "batch_size": data.global_rows}
    check_stream_binding(meta_path, meta, data, want, option="lem_features", err=err)
    if not isinstance(meta.get("k"), int) or meta["k"] < cfg.lem_k:
        raise err(f"{meta_path}: k is {meta.get('k')!r}, the run's lem_k is {cfg.lem_k}")
    if cfg.lem_window is not None and meta.get("window") != cfg.lem_window:
        raise err(f"{meta_path}: window is {meta.get('window')!r}, the run's lem_window is "
                  f"{cfg.lem_window}")


class LEMSideChannel:
    """Precomputed LEM features (``tokenmill ngram lem``) read in lockstep with the tokens.

    The side channel is aligned position for position with the global stream of the mix:
    rank ``rank`` of global step ``s`` reads the contiguous positions of its rows
    (:func:`tokenmill.train.side.rank_span`) and drops each row's last column.

    Values: match lengths come saturated at the file's dtype maximum (255 for uint8); a
    saturated length is read as ``max + 1`` ("at least max + 1"), so it lands in the
    model's open top bucket (256 by default): only a true length of exactly 255 moves up a
    bucket. Candidates stored as uint16 with 65,535 for "none" are read as int32 with -1.

    Raises (at construction):
        LEMSideChannelError: see :func:`check_side_channel`; a file missing, of the wrong
            shape, not contiguous with the previous one, with a sha256 other than
            ``lem.json``'s (``verify``), or a stream shorter than the run's steps; when
            the mix manifest lists the side channel, any file differing from that listing
            (:func:`tokenmill.train.side.check_mix_listing`).
    """

    key, names = "lem", LEM_NAMES
    mean_lag = float("nan")

    @classmethod
    def from_config(cls, data: TrainData, cfg: TrainConfig) -> LEMSideChannel | None:
        """The side channel ``lem_features`` names (checked; files hashed unless ``verify:
        false``)."""
        if not cfg.lem or cfg.lem_features is None:
            return None
        return cls(cfg.lem_features, data, cfg, verify=cfg.verify)

    def __init__(self, folder: str | Path, data: TrainData, cfg: TrainConfig,
                 verify: bool = True) -> None:
        err = LEMSideChannelError
        meta_path, meta = read_side_meta(folder, "lem.json", "lem-side-channel",
                                         "`tokenmill ngram lem MIX -o DIR`", err)
        check_side_channel(meta_path, meta, data, cfg)
        checked = check_mix_listing(meta_path, data, verify, err)
        self.files = SideFiles(meta_path, meta, {"len": ((), "iu"), "next": ((meta["k"],), "iu")},
                               verify, err, checked)
        steps = cfg.steps * cfg.grad_accum
        self.files.check_covers(steps * data.global_rows * data.row_tokens,
                                f"the run's {steps} steps")
        self.data, self.meta, self.k = data, meta, cfg.lem_k
        lens = self.files.arrays["len"]
        self.len_cap = int(np.iinfo(lens[0].dtype).max) if lens else None
        self.wait_s = 0.0
        self.step = 0

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream positions ``[lo, hi)``: ``(match_len int32 [n], next_tokens int32 [n, k])``
        (the run's ``k`` most recent candidates, -1 for none; lengths as in the class
        docstring)."""
        ml = self.files.read("len", lo, hi)
        nt = self.files.read("next", lo, hi)[:, : self.k]
        if self.len_cap is not None:
            ml = np.where(ml == self.len_cap, self.len_cap + 1, ml.astype(np.int32))
        nt = np.where(nt == 65535, -1, nt.astype(np.int32)) if nt.dtype == np.uint16 else nt
        return ml.astype(np.int32, copy=False), nt.astype(np.int32, copy=False)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of the loader's global step ``step``:
        ``(match_len int32 [B, T], candidates int32 [B, T, k])``."""
        t0 = time.perf_counter()
        ml, nt = self.read(*rank_span(self.data, step))
        out = rank_rows(self.data, ml), rank_rows(self.data, nt)
        self.wait_s += time.perf_counter() - t0
        self.step = step + 1
        return out

    def for_validation(self, val: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """:func:`lem_for_validation` with the side channel's window, ``max_len`` and length
        saturation."""
        return lem_for_validation(self.data, val, k=self.k, window=int(self.meta["window"]),
                                  max_len=int(self.meta["max_len"]), len_cap=self.len_cap)

    @property
    def lag(self) -> int:
        """Steps of features on disk past the ones read (the trainer never waits for them)."""
        return self.files.positions // (self.data.global_rows * self.data.row_tokens) - self.step

    def skip_to(self, step: int) -> None:
        """Nothing to replay: features are read by step."""
        self.step = step

    def close(self) -> None:
        """Nothing to stop (the files are memory-mapped)."""
