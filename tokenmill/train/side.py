"""The trainer's side inputs: one interface, and the reading that side channels share.

A side input gives the model per-position features beside the tokens, read by the loader's
global step (so a resumed run, any ``grad_accum`` and any number of ranks read the same
global features). Four implement :class:`SideInput`:

* the LEM side channel made before the run (``lem_features``,
  :class:`tokenmill.train.lemside.LEMSideChannel`);
* the online LEM predictor in its own process (``lem: true``,
  :class:`tokenmill.train.lemside.LEMFeed`);
* LEM features from Ray CPU workers running ahead (``lem_workers``,
  :class:`tokenmill.train.lemworkers.LEMWorkers`);
* the n-gram side channel (``ngram_features``,
  :class:`tokenmill.train.ngramside.NgramSideChannel`).

A side channel is a metadata file (``lem.json``, ``ngram.json``) and ``.npy`` array files
contiguous along the global stream (position ``p`` of the files is position ``p`` of the
stream: rows of ``seq_len + 1`` tokens back to back, global rows per step). What reading
one takes is here: :func:`read_side_meta`, :func:`check_stream_binding` (bound to the mix by
its identity and to the stream geometry), :func:`check_mix_listing` and :class:`SideFiles`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from tokenmill.atomic import sha256_file
from tokenmill.manifests.mixschema import SideChannelListingError, verify_listed_side_channel
from tokenmill.train.batches import TrainData
from tokenmill.train.config import TrainConfig


class SideInput(Protocol):
    """What the trainer reads from a side input.

    ``names`` are the model's keywords for the two arrays :meth:`get` returns; ``wait_s`` is
    the seconds the trainer spent in :meth:`get` (waiting for a producer or reading files),
    ``lag`` the steps of features ready past the trainer's (0: the trainer waits) and
    ``mean_lag`` its mean over the steps read (NaN where it means nothing).
    """

    names: tuple[str, str]
    wait_s: float

    @property
    def lag(self) -> int: ...

    @property
    def mean_lag(self) -> float: ...

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's features of the loader's global step ``step``, ``[B, T, ...]``."""
        ...

    def for_validation(self, val: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The features of the fixed validation rows ``int64 [Nv, T + 1]``: ``[Nv, T, ...]``
        arrays made as the training features are, from training data only."""
        ...

    def skip_to(self, step: int) -> None:
        """Continue at ``step`` after a resume."""
        ...

    def close(self) -> None:
        """Stop whatever produces the features (a process, Ray tasks), if anything."""
        ...


class SideInputKind(Protocol):
    """A kind of side input: ``key`` names the model input it feeds (``"lem"``, ``"ngram"``;
    a config selects at most one kind per key), and :meth:`from_config` opens it when the
    run's config asks for it."""

    key: str

    def from_config(self, data: TrainData, cfg: TrainConfig) -> SideInput | None:
        """The side input ``cfg`` asks for over ``data``, or ``None``.

        Raises:
            ValueError: a side channel that does not belong to the run (one line naming
                the file).
        """
        ...


def rank_span(data: TrainData, step: int) -> tuple[int, int]:
    """Global stream positions ``[lo, hi)`` of this rank's rows of global step ``step``:
    rows ``step * global_rows + rank * rows + [0, rows)``."""
    row0 = step * data.global_rows + data.rank * data.rows
    return row0 * data.row_tokens, (row0 + data.rows) * data.row_tokens


def rank_rows(data: TrainData, a: np.ndarray) -> torch.Tensor:
    """Positions of :func:`rank_span` (``[rows * (T + 1), ...]``) as this rank's model input
    ``[rows, T, ...]``: each row's last position (only a target) dropped."""
    rows = a.reshape(data.rows, data.row_tokens, *a.shape[1:])
    return torch.from_numpy(np.ascontiguousarray(rows[:, : data.seq_len]))


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


def check_stream_binding(meta_path: Path, meta: dict, data: TrainData, want: dict, *,
                         option: str, err: type[ValueError]) -> None:
    """Refuse a side channel made for another mix or stream geometry: the mix identity
    (:attr:`TrainData.mix_sha256`, so listing side channels in the manifest does not break
    the binding), ``remainder: carry``, ``seq_len`` and the fields of ``want`` (the split,
    the global rows per step ``batch_size`` where the stream depends on it, a mode).

    Raises:
        err: one line naming ``meta_path``, the field, its value and the run's.
    """
    data.require_mix(f"{meta_path}: {option}", err)
    sha = data.mix_sha256
    if meta.get("mix_sha256") != sha:
        raise err(f"{meta_path}: made for the mix {meta.get('mix')} (sha256 "
                  f"{str(meta.get('mix_sha256'))[:12]}), the run's data "
                  f"{data.manifest_path} has identity sha256 {sha[:12]}")
    for key, value in {**want, "remainder": "carry", "seq_len": data.seq_len}.items():
        if meta.get(key) != value:
            extra = (f" (batch_size {data.rows} x {data.world} ranks: global rows per step)"
                     if key == "batch_size" and want.get("split") == "train" else "")
            raise err(f"{meta_path}: {key} is {meta.get(key)!r}, the run needs {value!r}{extra}")


def check_mix_listing(meta_path: Path, data: TrainData, verify: bool,
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
        checked = verify_listed_side_channel(data.manifest_path, meta_path, hash_files=verify)
    except SideChannelListingError as e:
        raise err(str(e)) from None
    return checked or {}


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

    def check_covers(self, need: int, what: str) -> None:
        """Refuse files shorter than ``need`` stream positions (``what`` needs them).

        Raises:
            err: one line naming the metadata file and both counts.
        """
        if self.positions < need:
            raise self.err(f"{self.meta_path}: {self.positions:,} positions, {what} need "
                           f"{need:,}")

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
