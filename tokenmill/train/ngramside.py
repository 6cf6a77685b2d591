"""The trainer's n-gram side input: the interpolated n-gram model's top-``m`` next-token
candidates and log-probabilities per position, read in lockstep with the tokens.

The side channel is made before the run by ``tokenmill ngram features MIX -o DIR``
(:mod:`tokenmill.ngram.ngramfeat`; format: ``ngram.json`` plus ``ngram_cand_NNNNNN.npy``
``[n, m]`` and ``ngram_logp_NNNNNN.npy`` ``[n, m]`` float16 per file). Position ``p`` of the
files is position ``p`` of the MixLoader stream of the mix (rows of ``seq_len + 1`` tokens
back to back, global rows per step): the LEM side channel's alignment, so
:class:`NgramSideChannel` reads by the loader's global step like
:class:`tokenmill.train.side.LEMSideChannel` (resume, any ``grad_accum``, any number of
ranks: the same global features). The counts behind a position never include its own next
token or anything after it (the producer's chunk rule); validation positions get counts from
training data only (:func:`ngram_for_validation`).

The reading logic shared by side channels (meta file, binding to the mix by
:func:`tokenmill.manifests.mixschema.mix_identity_sha256`, stream geometry, contiguous
sha256-verified ``.npy`` files, reads that cross file boundaries) is here:
:func:`read_side_meta`, :func:`check_stream_binding` and :class:`SideFiles`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.atomic import sha256_file
from tokenmill.manifests.mixschema import mix_identity_sha256
from tokenmill.manifests.verify import manifest_file
from tokenmill.train.batches import data_kind, data_tokenizer
from tokenmill.train.config import TrainConfig
from tokenmill.train.side import check_mix_listing, train_prefix

NGRAM_META = "ngram.json"
NGRAM_KIND = "ngram-side-channel"
MAKE_NGRAM = "`tokenmill ngram features MIX -o DIR`"
#: floor of the log-probabilities handed to the model (float16 files may hold -inf)
LOGP_FLOOR = -30.0


class NgramSideChannelError(ValueError):
    """An n-gram side channel that does not belong to this run, or a file of it that cannot
    be trusted (one line naming the file)."""


# ----------------------------------------------------------------------------------------------
# shared side-channel reading
# ----------------------------------------------------------------------------------------------


def read_side_meta(folder: str | Path, name: str, kind: str, maker: str,
                   err: type[ValueError]) -> tuple[Path, dict]:
    """``(path, parsed JSON)`` of a side channel's metadata file ``folder/name``.

    Raises:
        err: missing, not JSON, or not of ``kind`` (one line naming the file).
    """
    meta_path = Path(folder) / name
    if not meta_path.is_file():
        raise err(f"{meta_path}: no side channel here (make one with {maker})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise err(f"{meta_path}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") != kind:
        got = meta.get("kind") if isinstance(meta, dict) else None
        raise err(f"{meta_path}: not a {kind} (kind {got!r})")
    return meta_path, meta


def check_stream_binding(meta_path: Path, meta: dict, cfg: TrainConfig, *, split: str,
                         batch_size: int | None, option: str, err: type[ValueError]) -> None:
    """Refuse a side channel made for another mix or stream geometry: the mix identity
    (:func:`~tokenmill.manifests.mixschema.mix_identity_sha256`, so listing side channels
    in the manifest does not break the binding), ``split``, ``seq_len``, the global rows per
    step ``batch_size`` (``None``: any, for the val split, whose stream of rows does not
    depend on it) and ``remainder: carry``.

    Raises:
        err: one line naming ``meta_path``, the field, its value and the run's.
    """
    mf = manifest_file(cfg.data)
    if data_kind(cfg.data) != "training-mix":
        raise err(f"{meta_path}: {option} needs data: to be a training-mix manifest "
                  f"(`tokenmill mix build`), {mf} is a curation manifest")
    sha = mix_identity_sha256(mf)
    if meta.get("mix_sha256") != sha:
        raise err(f"{meta_path}: made for the mix {meta.get('mix')} (sha256 "
                  f"{str(meta.get('mix_sha256'))[:12]}), the run's data {mf} has identity "
                  f"sha256 {sha[:12]}")
    want = {"split": split, "remainder": "carry", "seq_len": cfg.seq_len}
    if batch_size is not None:
        want["batch_size"] = batch_size
    for key, value in want.items():
        if meta.get(key) != value:
            extra = (" (global rows per step)" if key == "batch_size" and split == "train"
                     else "")
            raise err(f"{meta_path}: {key} is {meta.get(key)!r}, the run needs {value!r}{extra}")


class SideFiles:
    """The array files of a side channel, contiguous along the stream, read by position.

    ``meta["files"]`` lists ``{"start", "tokens", key: file, key + "_sha256": hex}`` per
    file; ``keys`` maps each key to the trailing shape of its arrays (``()`` for ``[n]``,
    ``(m,)`` for ``[n, m]``) and the dtype kinds allowed (``"iu"``, ``"f"``).

    Raises (at construction):
        err: a file missing, not ``.npy``, of the wrong shape or dtype, not contiguous with
            the previous one, or (``verify``) with a sha256 other than the metadata's
            (``checked``: ``{resolved path: sha256}`` already hashed, not hashed again).
    """

    def __init__(self, meta_path: Path, meta: dict, keys: dict[str, tuple[tuple, str]],
                 verify: bool, err: type[ValueError],
                 checked: dict[str, str] | None = None) -> None:
        self.meta_path, self.err, self.checked = meta_path, err, checked or {}
        self.arrays: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        starts, done = [], 0
        files = meta.get("files", [])
        for i, e in enumerate(files if isinstance(files, list) else [None]):
            try:  # a hand-edited entry: named, not a raw TypeError deep in the reader
                start, n = int(e.get("start", -1)), int(e["tokens"])
            except (AttributeError, KeyError, TypeError, ValueError):
                raise err(f"{meta_path}: files[{i}] is not an entry with integer 'start' and "
                          f"'tokens' ({e!r:.80})") from None
            if start != done:
                raise err(f"{meta_path}: a file starts at position {start}, the "
                          f"files before end at {done}")
            for key, (trail, kinds) in keys.items():
                self.arrays[key].append(self._open(e, key, (n, *trail), kinds, verify))
            starts.append(done)
            done += n
        self.starts = np.array([*starts, done], np.int64)

    @property
    def positions(self) -> int:
        """Stream positions covered."""
        return int(self.starts[-1])

    def _open(self, e: dict, key: str, shape: tuple, kinds: str, verify: bool) -> np.ndarray:
        root = self.meta_path.parent
        f = root / str(e.get(key))
        if not f.is_file():
            raise self.err(f"{f}: missing (listed in {self.meta_path})")
        want = e.get(f"{key}_sha256")
        if verify and not isinstance(want, str):
            raise self.err(f"{self.meta_path}: entry for {f.name} has no {key}_sha256")
        if verify and self.checked.get(str(f.resolve())) != want and sha256_file(f) != want:
            raise self.err(f"{f}: sha256 differs from {self.meta_path} (the file changed "
                           "after it was written)")
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except ValueError as x:
            raise self.err(f"{f}: not a .npy array ({x})") from None
        if a.shape != shape or a.dtype.kind not in kinds:
            raise self.err(f"{f}: shape {a.shape} {a.dtype}, {self.meta_path.name} says "
                           f"{shape} of kind {kinds!r}")
        return a

    def read(self, key: str, lo: int, hi: int) -> np.ndarray:
        """Positions ``[lo, hi)`` of ``key``'s arrays, concatenated (a copy, file dtype)."""
        parts = []
        i = int(np.searchsorted(self.starts, lo, side="right")) - 1
        o = lo
        while o < hi:
            a = o - int(self.starts[i])
            b = min(hi, int(self.starts[i + 1])) - int(self.starts[i])
            parts.append(np.asarray(self.arrays[key][i][a:b]))
            o += b - a
            i += 1
        return np.concatenate(parts) if parts else np.zeros(0)


# ----------------------------------------------------------------------------------------------
# the n-gram side channel
# ----------------------------------------------------------------------------------------------


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


def open_ngram_files(folder: str | Path, cfg: TrainConfig, *, split: str,
                     batch_size: int | None, verify: bool) -> tuple[Path, dict, SideFiles, int]:
    """Check and open an n-gram side channel: ``(meta path, meta, files, m)`` with ``m`` the
    run's ``ngram_m`` (default: the file's).

    Raises:
        NgramSideChannelError: see :func:`check_stream_binding` and :class:`SideFiles`; an
            ``m`` below the run's ``ngram_m``; when the mix manifest lists the side channel,
            a file differing from that listing
            (:func:`tokenmill.train.side.check_mix_listing`).
    """
    err = NgramSideChannelError
    option = "ngram_features" if split == "train" else "ngram_val_features"
    meta_path, meta = read_side_meta(folder, NGRAM_META, NGRAM_KIND, MAKE_NGRAM, err)
    check_stream_binding(meta_path, meta, cfg, split=split, batch_size=batch_size,
                         option=option, err=err)
    fm = meta.get("m")
    if not isinstance(fm, int) or fm < 1 or (cfg.ngram_m is not None and fm < cfg.ngram_m):
        raise err(f"{meta_path}: m is {fm!r}, the run's ngram_m is {cfg.ngram_m}")
    m = cfg.ngram_m or fm
    checked = check_mix_listing(meta_path, cfg, verify, err)
    files = SideFiles(meta_path, meta, {"cand": ((fm,), "iu"), "logp": ((fm,), "f")},
                      verify, err, checked)
    return meta_path, meta, files, m


class NgramSideChannel:
    """Precomputed n-gram features read in lockstep with the tokens (the alignment of
    :class:`tokenmill.train.side.LEMSideChannel`: rank ``rank`` of global step ``s`` reads
    rows ``s * Bg + rank * B + [0, B)`` of the stream, each row's first ``T`` positions).

    ``get(step)`` returns ``(candidates int32 [B, T, m] (-1 = none), logp float32 [B, T,
    m])`` (:func:`decode_ngram`) and accumulates ``wait_s``.

    Raises (at construction):
        NgramSideChannelError: see :func:`open_ngram_files`; a stream shorter than the run's
            steps.
    """

    def __init__(self, folder: str | Path, cfg: TrainConfig, rank: int, world: int,
                 verify: bool = True) -> None:
        self.Bg = cfg.batch_size * world
        self.meta_path, self.meta, self.files, self.m = open_ngram_files(
            folder, cfg, split="train", batch_size=self.Bg, verify=verify)
        self.T, self.B, self.rank = cfg.seq_len, cfg.batch_size, rank
        need = cfg.steps * cfg.grad_accum * self.Bg * (self.T + 1)
        if self.files.positions < need:
            raise NgramSideChannelError(
                f"{self.meta_path}: {self.files.positions:,} positions, the run's "
                f"{cfg.steps * cfg.grad_accum} steps need {need:,}")
        self.wait_s = 0.0

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of the loader's global step ``step``."""
        t0 = time.perf_counter()
        w = self.T + 1
        row0 = step * self.Bg + self.rank * self.B
        lo, hi = row0 * w, (row0 + self.B) * w
        cand, logp = decode_ngram(self.files.read("cand", lo, hi),
                                  self.files.read("logp", lo, hi), self.m)
        out = (torch.from_numpy(np.ascontiguousarray(cand.reshape(self.B, w, -1)[:, : self.T])),
               torch.from_numpy(np.ascontiguousarray(logp.reshape(self.B, w, -1)[:, : self.T])))
        self.wait_s += time.perf_counter() - t0
        return out


def ngram_for_validation(cfg: TrainConfig, val: torch.Tensor, feed: NgramSideChannel,
                         world: int = 1, verify: bool = True
                         ) -> tuple[np.ndarray, np.ndarray]:
    """N-gram features of the fixed validation rows (``int64 [Nv, T + 1]``) from training
    data only: read from ``cfg.ngram_val_features`` (a ``--split val`` side channel: the
    val split is read once in manifest order without shuffling, so its stream of rows is
    the same for any batch size, and :func:`~tokenmill.train.batches.validation_set`'s
    rows are its first ``Nv`` rows, back to back), or else computed now with
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
    if cfg.ngram_val_features is not None:
        meta_path, _, files, m = open_ngram_files(cfg.ngram_val_features, cfg, split="val",
                                                  batch_size=None, verify=verify)
        if files.positions < nv * w:
            raise NgramSideChannelError(f"{meta_path}: {files.positions:,} positions, the "
                                        f"{nv} validation rows need {nv * w:,}")
        cand, logp = files.read("cand", 0, nv * w), files.read("logp", 0, nv * w)
    else:
        from tokenmill.ngram.ngramfeat import precompute_ngram

        meta = feed.meta
        history = train_prefix(cfg, int(meta["tokens"]), world)
        cand, logp = precompute_ngram(  # one chunk: counts of the history only
            val.numpy().astype(np.int32).reshape(-1), orders=list(meta["orders"]),
            m=int(meta["m"]), chunk_tokens=None, beta=float(meta["beta"]),
            eot=int(meta["eot"]), n_vocab=data_tokenizer(cfg.data).n_vocab, history=history)
    cand, logp = decode_ngram(np.asarray(cand), np.asarray(logp), feed.m)
    return (np.ascontiguousarray(cand.reshape(nv, w, -1)[:, :-1]),
            np.ascontiguousarray(logp.reshape(nv, w, -1)[:, :-1]))
