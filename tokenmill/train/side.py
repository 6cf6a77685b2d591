"""The trainer's side inputs: prefix auxiliary targets, legality mask rows, LEM features.

* prefix auxiliary target: the longest proper token prefix of each target
  (:class:`tokenmill.tokenizers.prefix.PrefixMap`), trained with a weighted second
  cross-entropy term (partial credit for a prefix of the right token);
* legality mask: packed rows of the tokenizer's possible (previous, next) pairs from a saved
  :class:`tokenmill.tokenizers.legality.LegalityTable` (polarity read from its header), used
  at evaluation only;
* LEM feature: the causal longest-exact-match predictor's match length and candidate next
  tokens, per-position causality (``mode="position"``) in training and validation alike,
  over the global training stream (the same features for any number of ranks), either
  read from a side channel made before the run (``tokenmill ngram lem``,
  :class:`LEMSideChannel`, config ``lem_features``), or computed while training by Ray
  workers (:class:`tokenmill.train.lemworkers.LEMWorkers`, ``lem_workers``) or by the
  online predictor in its own process (:class:`LEMFeed`,
  :class:`tokenmill.ngram.stream.LEMStream`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.atomic import sha256_file
from tokenmill.manifests.mixschema import (
    SideChannelListingError,
    mix_identity_sha256,
    verify_listed_side_channel,
)
from tokenmill.manifests.verify import manifest_file
from tokenmill.ngram.precompute import precompute_lem
from tokenmill.ngram.stream import LEMStream
from tokenmill.tokenizers.legality import LegalityTable
from tokenmill.tokenizers.prefix import PrefixMap
from tokenmill.train.batches import data_kind, open_loader
from tokenmill.train.config import TrainConfig


def prefix_array(encoding_name: str) -> np.ndarray:
    """``int32 [n_vocab]``: the longest proper token prefix of each token, -1 if none
    (:class:`tokenmill.tokenizers.prefix.PrefixMap`), used as the auxiliary target."""
    return np.asarray(PrefixMap.build(encoding_name).parent, dtype=np.int32)


def load_mask_bits(path: str, n_vocab: int, encoding_name: str | None = None) -> torch.Tensor:
    """Packed legality rows ``uint8 [n_vocab, ceil(n_vocab/8)]`` (LSB-first, 1 = possible) of
    a saved :class:`~tokenmill.tokenizers.legality.LegalityTable` file or folder.

    Every file goes through :meth:`LegalityTable.load`, which reads what a set bit means from
    the file's own header: tokenmill's tables (1 = possible) are used as they are, an export
    in modded-nanogpt's forbidden-pair polarity (``tokenmill legality export --format
    modded-nanogpt``) is inverted, and a file that does not state its polarity (a bare
    ``.npy`` mask) is refused, never guessed.

    Raises:
        LegalityFormatError: not a table file, or a header without polarity (a ValueError).
        TokenizerMismatchError: the table is another tokenizer's (``encoding_name``).
        ValueError: the rows do not cover the vocabulary.
    """
    table = LegalityTable.load(Path(path), encoding=encoding_name)
    bits = np.array(table.packed, dtype=np.uint8, order="C")  # a writable in-memory copy
    need = (n_vocab + 7) // 8
    if bits.ndim != 2 or bits.shape[0] < n_vocab or bits.shape[1] < need:
        raise ValueError(
            f"{path}: legality rows have shape {bits.shape}, need at least ({n_vocab}, {need})"
        )
    return torch.from_numpy(bits)


def save_rows_table(encoding_name: str, prev_ids: np.ndarray, path: str | Path) -> Path:
    """Build the legality rows of just the previous tokens ``prev_ids`` (``int [N]``) and save
    them as a full table file (tokenmill's header, 1 = possible) whose other rows allow every
    next token: sound (never masks a possible pair) and quick for masked validation on a
    small set, where only the validation inputs' rows are ever read.

    Returns:
        the file written (:meth:`LegalityTable.save` naming, atomic).
    """
    rows = np.unique(np.asarray(prev_ids, dtype=np.int64))
    part = LegalityTable.build(encoding_name, rows=rows)
    V = part.n_vocab
    bits = np.full((V, part.row_bytes), 0xFF, dtype=np.uint8)
    if V % 8:
        bits[:, -1] = np.uint8((1 << (V % 8)) - 1)
    bits[rows] = np.asarray(part.packed)
    meta = {**part.meta, "rows_built": int(len(rows)),
            "other_rows": "every next token possible (not built)"}
    return LegalityTable(part.identity, bits, meta).save(path)


def _lem_kwargs(cfg: TrainConfig) -> dict:
    kw: dict = {"max_len": cfg.lem_max_len}
    if cfg.lem_window is not None:
        kw["window"] = cfg.lem_window
    return kw


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

    def __init__(self, cfg: TrainConfig, rank: int, world: int, eot: int) -> None:
        b, bg = cfg.batch_size, cfg.batch_size * world

        def batches():
            loader = open_loader(cfg, "train", 0, 1, batch_size=bg, verify=False)
            while True:  # whole rows of T + 1: the stream of `ngram lem`
                d = loader.next_batch()
                yield torch.cat([d["inputs"], d["targets"][:, -1:]], dim=1).numpy()

        self.stream = LEMStream(batches(), (bg, cfg.seq_len + 1), eot=eot,
                                k=cfg.lem_k, n_steps=cfg.steps, ahead=cfg.lem_ahead,
                                mode="position", **_lem_kwargs(cfg))
        self.rows = (slice(rank * b, (rank + 1) * b), slice(0, cfg.seq_len))
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


class LEMSideChannelError(ValueError):
    """A LEM side channel that does not belong to this run, or a file of it that cannot be
    trusted (one line naming the file)."""


def _side_meta(folder: str | Path) -> tuple[Path, dict]:
    meta_path = Path(folder) / "lem.json"
    if not meta_path.is_file():
        raise LEMSideChannelError(f"{meta_path}: no LEM side channel here (make one with "
                                  "`tokenmill ngram lem MIX -o DIR`)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LEMSideChannelError(f"{meta_path}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") != "lem-side-channel":
        raise LEMSideChannelError(f"{meta_path}: not a LEM side channel (kind "
                                  f"{meta.get('kind') if isinstance(meta, dict) else None!r})")
    return meta_path, meta


def check_side_channel(meta_path: Path, meta: dict, cfg: TrainConfig, world: int) -> None:
    """Refuse a side channel made for another mix or another stream geometry.

    The stream the features are aligned with is fixed by the mix manifest (its
    :func:`~tokenmill.manifests.mixschema.mix_identity_sha256`),
    the split, ``seq_len``, the global rows per step (``batch_size * world``: the same
    stream for any split of it into ranks) and the remainder mode; the features by the
    mode, ``k`` (at least ``cfg.lem_k``) and the window.

    Raises:
        LEMSideChannelError: one line naming ``lem.json``, the field, its value and the
            run's.
    """
    mf = manifest_file(cfg.data)
    if data_kind(cfg.data) != "training-mix":
        raise LEMSideChannelError(f"{meta_path}: lem_features needs data: to be a training-mix "
                                  f"manifest (`tokenmill mix build`), {mf} is a curation "
                                  "manifest")
    sha = mix_identity_sha256(mf)  # the mix without its side-channel listing
    if meta.get("mix_sha256") != sha:
        raise LEMSideChannelError(
            f"{meta_path}: made for the mix {meta.get('mix')} (sha256 "
            f"{str(meta.get('mix_sha256'))[:12]}), the run's data {mf} has sha256 {sha[:12]}")
    want = {"split": "train", "mode": "position", "remainder": "carry",
            "seq_len": cfg.seq_len, "batch_size": cfg.batch_size * world}
    for key, value in want.items():
        if meta.get(key) != value:
            extra = (f" (batch_size {cfg.batch_size} x {world} ranks: global rows per step)"
                     if key == "batch_size" else "")
            raise LEMSideChannelError(f"{meta_path}: {key} is {meta.get(key)!r}, the run needs "
                                      f"{value!r}{extra}")
    if not isinstance(meta.get("k"), int) or meta["k"] < cfg.lem_k:
        raise LEMSideChannelError(f"{meta_path}: k is {meta.get('k')!r}, the run's lem_k is "
                                  f"{cfg.lem_k}")
    if cfg.lem_window is not None and meta.get("window") != cfg.lem_window:
        raise LEMSideChannelError(f"{meta_path}: window is {meta.get('window')!r}, the run's "
                                  f"lem_window is {cfg.lem_window}")


def check_mix_listing(meta_path: Path, cfg: TrainConfig, verify: bool,
                      err: type[ValueError]) -> dict[str, str]:
    """Check a side channel the run's mix manifest lists against that listing
    (:func:`tokenmill.manifests.mixschema.verify_listed_side_channel`: metadata and array
    files' sha256, the mix identity; the array files are hashed only with ``verify``). A side
    channel the mix does not list is left to the reader's own checks.

    Returns:
        ``{resolved path: sha256}`` of the array files hashed here (empty if none), so the
        reader need not hash them again.

    Raises:
        err: one line naming the file that is missing or differs from the listing.
    """
    try:
        checked = verify_listed_side_channel(manifest_file(cfg.data), meta_path,
                                             hash_files=verify)
    except SideChannelListingError as e:
        raise err(str(e)) from None
    return checked or {}


class LEMSideChannel:
    """Precomputed LEM features (``tokenmill ngram lem``) read in lockstep with the tokens.

    The side channel is aligned position for position with the MixLoader stream of the
    mix: row ``g`` of the stream (row ``r`` of global step ``s`` is ``g = s * Bg + r``,
    ``Bg = batch_size * world``) covers positions ``g * (T + 1) + [0, T + 1)``; the
    trainer's inputs are the first ``T`` of them, so rank ``rank`` of step ``s`` reads
    the contiguous positions of rows ``s * Bg + rank * B + [0, B)`` and drops each row's
    last column. Indexed by the loader's global step, so a resumed run (and any
    ``grad_accum``) reads the same features, and any number of ranks reads the same global
    features.

    Values: match lengths come saturated at the file's dtype maximum (255 for uint8); a
    saturated length is read as ``max + 1`` ("at least max + 1"), so it lands in the
    model's open top bucket (256 by default): only a true length of exactly 255 moves up a
    bucket. Candidates stored as uint16 with 65,535 for "none" are read as int32 with -1.

    Raises (at construction):
        LEMSideChannelError: see :func:`check_side_channel`; a file missing, of the wrong
            shape, not contiguous with the previous one, with a sha256 other than
            ``lem.json``'s (``verify``), or a stream shorter than the run's steps; when
            the mix manifest lists the side channel, any file differing from that listing
            (:func:`check_mix_listing`).
    """

    def __init__(self, folder: str | Path, cfg: TrainConfig, rank: int, world: int,
                 verify: bool = True) -> None:
        meta_path, meta = _side_meta(folder)
        check_side_channel(meta_path, meta, cfg, world)
        checked = check_mix_listing(meta_path, cfg, verify, LEMSideChannelError)
        self.meta, self.k = meta, cfg.lem_k
        self.T, self.B, self.rank = cfg.seq_len, cfg.batch_size, rank
        self.Bg = cfg.batch_size * world
        self.lens, self.nexts, starts = [], [], []
        for e in meta.get("files", []):
            done = sum(a.size for a in self.lens)
            ml, nt = self._open(meta_path.parent, e, int(meta["k"]), done, verify, checked)
            starts.append(int(e["start"]))
            self.lens.append(ml)
            self.nexts.append(nt)
        self.starts = np.array([*starts, sum(a.size for a in self.lens)], np.int64)
        need = cfg.steps * cfg.grad_accum * self.Bg * (self.T + 1)
        if self.starts[-1] < need:
            raise LEMSideChannelError(f"{meta_path}: {self.starts[-1]:,} positions, the run's "
                                      f"{cfg.steps * cfg.grad_accum} steps need {need:,}")
        self.len_cap = int(np.iinfo(self.lens[0].dtype).max) if self.lens else None
        self.wait_s = 0.0
        self.step = 0

    @staticmethod
    def _open(root: Path, e: dict, k: int, start: int, verify: bool,
              checked: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
        if int(e.get("start", -1)) != start:
            raise LEMSideChannelError(f"{root / str(e.get('len'))}: starts at position "
                                      f"{e.get('start')}, the files before end at {start}")
        out = []
        for key, shape in (("len", (int(e["tokens"]),)), ("next", (int(e["tokens"]), k))):
            f = root / e[key]
            if not f.is_file():
                raise LEMSideChannelError(f"{f}: missing (listed in {root / 'lem.json'})")
            want = e[f"{key}_sha256"]
            if verify and checked.get(str(f.resolve())) != want and sha256_file(f) != want:
                raise LEMSideChannelError(f"{f}: sha256 differs from {root / 'lem.json'} (the "
                                          "file changed after `tokenmill ngram lem` wrote it)")
            try:
                a = np.load(f, mmap_mode="r", allow_pickle=False)
            except ValueError as err:
                raise LEMSideChannelError(f"{f}: not a .npy array ({err})") from None
            if a.shape != shape or a.dtype.kind not in "iu":
                raise LEMSideChannelError(f"{f}: shape {a.shape} {a.dtype}, lem.json says "
                                          f"{shape} integers")
            out.append(a)
        return out[0], out[1]

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream positions ``[lo, hi)``: ``(match_len int32 [n], next_tokens int32 [n, k])``
        (the run's ``k`` most recent candidates, -1 for none; lengths as in the class
        docstring)."""
        ml = np.empty(hi - lo, np.int32)
        nt = np.empty((hi - lo, self.k), np.int32)
        i = int(np.searchsorted(self.starts, lo, side="right")) - 1
        o = lo
        while o < hi:
            a, b = o - int(self.starts[i]), min(hi, int(self.starts[i + 1])) - int(self.starts[i])
            src_l, src_n = self.lens[i][a:b], self.nexts[i][a:b, : self.k]
            cap = np.iinfo(src_l.dtype).max
            ml[o - lo : o - lo + b - a] = np.where(src_l == cap, cap + 1, src_l.astype(np.int32))
            nt[o - lo : o - lo + b - a] = (np.where(src_n == 65535, -1, src_n.astype(np.int32))
                                           if src_n.dtype == np.uint16 else src_n)
            o += b - a
            i += 1
        return ml, nt

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of the loader's global step ``step``:
        ``(match_len int32 [B, T], candidates int32 [B, T, k])``."""
        t0 = time.perf_counter()
        row0 = step * self.Bg + self.rank * self.B
        w = self.T + 1
        ml, nt = self.read(row0 * w, (row0 + self.B) * w)
        out = (torch.from_numpy(np.ascontiguousarray(ml.reshape(self.B, w)[:, : self.T])),
               torch.from_numpy(np.ascontiguousarray(nt.reshape(self.B, w, self.k)[:, : self.T])))
        self.wait_s += time.perf_counter() - t0
        self.step = step + 1
        return out

    @property
    def lag(self) -> int:
        """Steps of features on disk past the ones read (the trainer never waits for them)."""
        return int(self.starts[-1] // (self.Bg * (self.T + 1))) - self.step

    mean_lag = float("nan")

    def skip_to(self, step: int) -> None:
        """Nothing to replay: features are read by step."""
        self.step = step

    def close(self) -> None:
        """Nothing to stop (the files are memory-mapped)."""


def train_prefix(cfg: TrainConfig, n_tokens: int, world: int = 1) -> np.ndarray:
    """The first ``n_tokens`` (at most) of the global training stream, ``int32 [n]``: the
    loader's rows of ``seq_len + 1`` tokens back to back (the stream of ``ngram lem``)."""
    loader = open_loader(cfg, "train", 0, 1, batch_size=cfg.batch_size * world, verify=False)
    parts, n = [], 0
    while n < n_tokens and loader.step < loader.num_steps:
        d = loader.next_batch()
        rows = torch.cat([d["inputs"], d["targets"][:, -1:]], dim=1).numpy().astype(np.int32)
        parts.append(rows.reshape(-1))
        n += rows.size
    return np.concatenate(parts)[:n_tokens] if parts else np.zeros(0, np.int32)


def lem_for_validation(cfg: TrainConfig, val: torch.Tensor, eot: int, *, k: int,
                       window: int, max_len: int, world: int = 1, len_cap: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """LEM side input for the fixed validation rows, ahead of time and in position mode, as
    the training features: :func:`tokenmill.ngram.precompute.precompute_lem` over the first
    ``H = window // 2`` tokens of the training stream (``window = 0``: 4 M) followed by the
    validation rows (``int64 [Nv, T + 1]``) back to back; the validation positions' answers
    are kept. So every validation position sees, causally, at least ``H`` tokens of
    training history (as a training position past the first ``H`` tokens does) plus the
    validation rows before it; nothing of a validation target or after it. The same
    features at every evaluation, so validation losses are comparable across steps.
    ``len_cap``: the side channel's saturation (lengths ``>= len_cap`` read as
    ``len_cap + 1``, as :class:`LEMSideChannel` reads them).

    Returns:
        ``(match_len int32 [Nv, T], candidates int32 [Nv, T, k])``.
    """
    prime = train_prefix(cfg, (window // 2) if window else 4_000_000, world)
    rows = val.numpy().astype(np.int32)
    ml, nt = precompute_lem(np.concatenate([prime, rows.reshape(-1)]), k=k, mode="position",
                            window=window, eot=eot, max_len=max_len)
    nv, w = rows.shape
    ml = ml[prime.size:].reshape(nv, w)[:, :-1]
    nt = nt[prime.size:].reshape(nv, w, k)[:, :-1]
    if len_cap is not None:
        ml = np.where(ml >= len_cap, len_cap + 1, ml).astype(np.int32)
    return np.ascontiguousarray(ml), np.ascontiguousarray(nt)
