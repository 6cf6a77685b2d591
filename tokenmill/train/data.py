"""The training data loader: batches from a training-mix manifest.

API (for trainers)
==================

>>> from tokenmill.train.data import MixLoader
>>> loader = MixLoader("out/mix.json", seq_len=1024, batch_size=64,   # global rows/step
...                    world_size=8, rank=0, dtype=np.int32)            # doctest: +SKIP
>>> for batch in loader:                                                # doctest: +SKIP
...     batch["inputs"]      # (batch_size // world_size, seq_len) int64/int32 (numpy or torch)
...     batch["targets"]     # same shape: inputs shifted by one (next-token labels)
...     batch["cu_seqlens"]  # int32 [n_segments + 1]: cumulative segment lengths over the
...                          # flattened inputs (0 ... rows*seq_len), for varlen attention;
...                          # segments never cross rows and each starts with BOS/EOT
...     batch["max_seqlen"]  # int, longest segment
...     batch["sources"]     # int16 [rows]: source index (into loader.source_names) per row
...     batch["step"]        # int, the global step of this batch
...     state = loader.state_dict()   # JSON-serializable; resume with
...                                   # MixLoader(..., state=state) or load_state_dict(state)
>>> loader.summary()   # per source: rows, share, tokens read, epochs (simulated, no copies)
...                    # doctest: +SKIP

``len(loader)`` / ``loader.num_steps`` is the number of steps the manifest's token budget
gives: a step reads ``batch_size * (seq_len + 1)`` tokens, so ``num_steps = total_tokens
// (batch_size * (seq_len + 1))`` and no source is read past its granted tokens (to
within one row); the iteration stops there. Options:
``output="torch"`` (tensors; ``pin_memory=True`` pins them when CUDA is available),
``split="val"`` (the val shards of all sources, in manifest order, one pass, no
shuffling), ``remainder="carry" | "drop"``, ``provenance=True`` (adds ``pieces``, see
below), ``verify=False`` (skip the sha256 check of every shard and sidecar against the
manifest; presence and headers are always checked, see
:func:`tokenmill.manifests.verify.open_shards`).

A curation manifest (``tokenmill run``'s ``manifest.json``) is read through the same code:
:meth:`MixLoader.from_curation` plans an in-memory training-mix manifest over all its
sources at their mixture weights (one pass by default, document-aligned, no replacement).

Semantics
=========
The schedule (which document fills which row, the shuffles and the mixture) is
:mod:`tokenmill.manifests.schedule`, shared with the modded-nanogpt exporter, which writes
exactly the token stream this loader yields for the same mix, seed, seq_len and batch.
* **Rows.** A step is ``batch_size`` rows of ``seq_len + 1`` tokens (inputs = row[:-1],
  targets = row[1:]); rank ``r`` of ``world_size`` gets rows ``[r*b, (r+1)*b)`` with
  ``b = batch_size // world_size``, so ranks get disjoint, equal parts of every step and
  their union is exactly the single-rank stream for the same global batch.
* **Mixture.** Each row is filled from one source. Sources are assigned to rows by
  smooth weighted round-robin (nginx's SWRR, a deterministic deficit scheduler) over
  the manifest's effective per-segment weights, so after any number of rows each
  source's share of rows is within one row of its weight; the rows of each step are then
  permuted with the seed so that ranks do not see fixed source patterns.
* **Documents.** Each source's documents (only those inside the manifest's token
  ranges) are read in a seeded random order, reshuffled every epoch (Fisher-Yates with
  a splitmix64 stream keyed by seed, source and epoch), as many epochs as the budget
  needs. A row starts at a document start (its EOT/BOS token) and packs whole
  documents, as modded-nanogpt's BOS-aligned loader does. The document that does not
  fit in the rest of a row is split: its head closes the row and, with
  ``remainder="carry"`` (default, no token is lost), its tail opens the source's next
  row with the BOS/EOT token prepended (that one token is the only token not read from
  a shard); with ``remainder="drop"`` the tail is dropped, as modded-nanogpt does,
  except for a document longer than a whole row, whose rest is always carried.
  Thus every row, and every cu_seqlens segment, starts with BOS/EOT.
* **Memory.** Shards are ``np.memmap``-ed once; the plan of each step (which source /
  document / offset fills which row) is computed by a numba kernel, then a second numba
  kernel copies the pieces straight from the memory maps into the output arrays.
* **Resume.** ``state_dict()`` after step ``s`` holds the next step, each source's
  cursor (epoch, position in the epoch's order, carried tail) and the scheduler
  credits; a loader built with it yields exactly the batches an uninterrupted run yields
  from step ``s`` on, for any ``world_size`` with the same global batch and seq_len.

``provenance=True`` adds ``pieces``: int64 [n_pieces, 5] rows of (local row, shard index
into ``loader.shard_paths``, token offset in the shard, tokens read, 1 if a BOS was
prepended) in row order, for checks and debugging.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numba
import numpy as np
from numba import njit

from tokenmill.manifests.mix import curation_mix
from tokenmill.manifests.mixschema import TrainingMixManifest
from tokenmill.manifests.schedule import MixDocuments, MixSchedule, load_documents
from tokenmill.manifests.verify import read_manifest
from tokenmill.tokenizers import check_installed

STATE_VERSION = 1

__all__ = ["STATE_VERSION", "MixDocuments", "MixLoader", "load_documents"]


@njit(cache=True)
def _fill(shards, eot, T, row_lo, row_hi, row_ptr, piece_shard, piece_off, piece_len,
          piece_bos, inputs, targets, cu):
    """Copy the pieces of rows [row_lo, row_hi) from the memory-mapped shards.

    inputs/targets: [rows, T]; cu: int32 capacity >= pieces + 1. Returns len(cu) used.
    """
    n_cu = 0
    for r in range(row_lo, row_hi):
        lr = r - row_lo
        xi = inputs[lr]
        yi = targets[lr]
        k = 0  # position in the row of T + 1 tokens
        last = 0  # the row's token T (only a target)
        for p in range(row_ptr[r], row_ptr[r + 1]):
            if k < T:
                cu[n_cu] = lr * T + k
                n_cu += 1
            if piece_bos[p]:
                if k < T:
                    xi[k] = eot
                else:
                    last = eot
                k += 1
            o = piece_off[p]
            n = piece_len[p]
            m = min(n, T - k)
            src = shards[piece_shard[p]]
            s = src[o:o + m]
            d = xi[k:k + m]
            for t in range(s.shape[0]):  # explicit loop: LLVM vectorizes it (slice
                d[t] = s[t]  # assignment with a dtype change does not)
            if m < n:
                last = src[o + n - 1]
            k += n
        for t in range(T - 1):  # targets = inputs shifted by one, from L1
            yi[t] = xi[t + 1]
        yi[T - 1] = last
    cu[n_cu] = (row_hi - row_lo) * T
    return n_cu + 1



class MixLoader:
    """Batches from a training-mix manifest (see the module docstring).

    Args:
        manifest: path of a training-mix manifest (``tokenmill mix build``) or the model
            itself (then ``root`` is the folder its paths are relative to). A curation
            manifest goes through :meth:`from_curation`.
        seq_len: T, tokens per row of inputs (rows hold T + 1 tokens).
        batch_size: global rows per step, a multiple of ``world_size``.
        world_size, rank: this process's share of every step.
        split: ``"train"`` (the mixture) or ``"val"`` (all val shards, one pass, in order).
        dtype: ``np.int64`` (default) or ``np.int32`` for inputs and targets.
        output: ``"numpy"`` or ``"torch"``; ``pin_memory`` pins torch tensors (if CUDA).
        remainder: ``"carry"`` or ``"drop"`` (what happens to a split document's tail).
        state: a ``state_dict()`` to resume from.
        max_steps: stop earlier than the manifest's budget.
        verify: check each shard's and sidecar's sha256 against the manifest (reads every
            byte); ``False`` skips only that.
        provenance: add ``pieces`` to each batch.

    Raises:
        ShardVerifyError: the manifest is missing, of the wrong kind (a curation manifest:
            use :meth:`from_curation`) or invalid; a shard or sidecar is missing,
            truncated, or its sha256 differs (naming the file).
        ValueError: bad sizes, a state from another configuration, document offsets that
            disagree with the manifest, a document not starting with the EOT token
            (naming file and row), mixed shard versions.
    """

    def __init__(
        self,
        manifest: str | os.PathLike | TrainingMixManifest,
        seq_len: int,
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        split: Literal["train", "val"] = "train",
        dtype: Any = np.int64,
        output: Literal["numpy", "torch"] = "numpy",
        pin_memory: bool = False,
        remainder: Literal["carry", "drop"] = "carry",
        state: dict | None = None,
        max_steps: int | None = None,
        verify: bool = True,
        provenance: bool = False,
        root: str | os.PathLike | None = None,
    ) -> None:
        if isinstance(manifest, TrainingMixManifest):
            mix, where = manifest, Path(root) if root is not None else Path.cwd()
        else:
            path, mix = read_manifest(manifest, kind="training-mix")
            check_installed(mix.tokenizer, str(path))
            where = path.resolve().parent
        self._set_up(mix, where, load_documents(mix, where, split, verify), seq_len,
                     batch_size, world_size, rank, split, dtype, output, pin_memory,
                     remainder, max_steps, provenance)
        if state is not None:
            self.load_state_dict(state)

    @classmethod
    def from_documents(cls, mix: TrainingMixManifest, root: str | os.PathLike,
                       docs: MixDocuments, seq_len: int, batch_size: int, *,
                       world_size: int = 1, rank: int = 0,
                       split: Literal["train", "val"] = "train",
                       output: Literal["numpy", "torch"] = "numpy") -> MixLoader:
        """A loader at step 0 over documents already listed: ``docs``, the ``split``
        documents of the training-mix manifest ``mix`` (shard paths relative to ``root``),
        as :func:`tokenmill.train.batches.open_data` opens them once per run. Nothing is
        read again. Other arguments, and the ``ValueError`` s raised, are
        :class:`MixLoader`'s (int64 rows, ``remainder="carry"``)."""
        loader = cls.__new__(cls)
        loader._set_up(mix, Path(root), docs, seq_len, batch_size, world_size, rank, split,
                       np.int64, output, False, "carry", None, False)
        return loader

    def _set_up(self, mix: TrainingMixManifest, root: Path, docs: MixDocuments, seq_len: int,
                batch_size: int, world_size: int, rank: int, split: Literal["train", "val"],
                dtype: Any, output: Literal["numpy", "torch"], pin_memory: bool,
                remainder: Literal["carry", "drop"], max_steps: int | None,
                provenance: bool) -> None:
        """Check the arguments, take ``split``'s documents and plan the schedule (at
        step 0)."""
        self.manifest, self.root = mix, root
        self._check_args(seq_len, batch_size, world_size, rank, remainder, output, dtype)
        self.seq_len, self.batch_size = int(seq_len), int(batch_size)
        self.world_size, self.rank = int(world_size), int(rank)
        self.local_batch = self.batch_size // self.world_size
        self.split = split
        self.dtype = np.dtype(dtype)
        self.output, self.pin_memory = output, pin_memory
        self.remainder = remainder
        self.provenance = provenance
        self.eot = int(self.manifest.tokenizer.eot_token)
        self._use_documents(docs)
        self.schedule = MixSchedule(self.manifest, self.documents, split, self.seq_len,
                                    self.batch_size, carry_all=remainder == "carry")
        steps = self.schedule.num_steps()
        self.num_steps = int(steps if max_steps is None else min(steps, max_steps))
        self.step = 0  # a new schedule starts before step 0

    @classmethod
    def from_curation(cls, manifest: str | os.PathLike, seq_len: int, batch_size: int, *,
                      seed: int = 0, epochs: float = 1.0, verify: bool = True,
                      **kwargs: Any) -> MixLoader:
        """A loader over a curation manifest (``manifest.json`` or its folder) through the
        same code: :func:`~tokenmill.manifests.mix.curation_mix` plans the in-memory
        training-mix manifest (every source at its mixture weight, at most ``epochs``
        passes, no replacement); other arguments are :class:`MixLoader`'s. ``num_steps``
        is that budget's steps."""
        m, root = curation_mix(manifest, seed=seed, epochs=epochs, verify=verify)
        return cls(m, seq_len, batch_size, root=root, verify=False, **kwargs)

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _check_args(seq_len: int, batch_size: int, world_size: int, rank: int,
                    remainder: str, output: str, dtype: Any) -> None:
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be >= 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        if batch_size % world_size:
            raise ValueError(f"global batch_size {batch_size} is not a multiple of "
                             f"world_size {world_size}")
        if remainder not in ("carry", "drop"):
            raise ValueError(f"remainder must be 'carry' or 'drop', not {remainder!r}")
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', not {output!r}")
        if np.dtype(dtype) not in (np.dtype(np.int64), np.dtype(np.int32)):
            raise ValueError(f"dtype must be int64 or int32, not {np.dtype(dtype)}")

    def _use_documents(self, docs: MixDocuments) -> None:
        self.documents = docs
        self.source_names = docs.source_names
        self.shard_paths = docs.shard_paths
        self._shards = numba.typed.List(docs.shards)
        if self.split == "train":
            for s, a, b in zip(self.manifest.sources, docs.src_lo, docs.src_hi, strict=True):
                if a == b and s.granted_tokens > 0:
                    raise ValueError(f"source {s.name!r} has granted tokens but no documents")

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Go back to step 0."""
        self.step = 0
        self.schedule.reset()

    def _config(self) -> dict:
        return {"name": self.manifest.name, "spec_sha256": self.manifest.spec_sha256,
                "split": self.split, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "remainder": self.remainder, "sources": list(self.source_names)}

    def state_dict(self) -> dict:
        """JSON-serializable state after the last yielded batch (rank-independent)."""
        return {"version": STATE_VERSION, "config": self._config(), "step": int(self.step),
                **self.schedule.cursors()}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` output.

        Raises:
            ValueError: the state is from another manifest, split, seq_len, global batch
                size or remainder mode (names the differing fields).
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')} != {STATE_VERSION}")
        mine = self._config()
        diff = {k: (state["config"].get(k), v) for k, v in mine.items()
                if state["config"].get(k) != v}
        if diff:
            raise ValueError(f"loader state does not match this loader: {diff} "
                             "(state value, loader value)")
        self.step = int(state["step"])
        self.schedule.load_cursors(state)

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.num_steps

    def _alloc(self, shape: tuple[int, ...], dtype: np.dtype):
        if self.output == "torch":
            import torch

            tdt = torch.int64 if dtype == np.int64 else torch.int32
            pin = self.pin_memory and torch.cuda.is_available()
            t = torch.empty(shape, dtype=tdt, pin_memory=pin)
            return t, t.numpy()
        a = np.empty(shape, dtype)
        return a, a

    def next_batch(self) -> dict:
        """The next batch (see the module docstring). Raises ``StopIteration`` at the end."""
        if self.step >= self.num_steps:
            raise StopIteration
        sc = self.schedule
        sc.plan(self.step)
        lo, hi = self.rank * self.local_batch, (self.rank + 1) * self.local_batch
        shape = (self.local_batch, self.seq_len)
        x, xn = self._alloc(shape, self.dtype)
        y, yn = self._alloc(shape, self.dtype)
        n_p = int(sc.row_ptr[hi] - sc.row_ptr[lo])
        cu = np.empty(n_p + 1, np.int32)
        n_cu = _fill(self._shards, self.eot, self.seq_len, lo, hi, sc.row_ptr,
                     sc.piece_shard, sc.piece_off, sc.piece_len, sc.piece_bos, xn, yn, cu)
        cu = cu[:n_cu]
        batch: dict[str, Any] = {
            "step": self.step,
            "inputs": x,
            "targets": y,
            "cu_seqlens": cu,
            "max_seqlen": int(np.diff(cu).max()) if n_cu > 1 else 0,
            "sources": sc.row_src[lo:hi].astype(np.int16),
        }
        if self.output == "torch":
            import torch

            batch["cu_seqlens"] = torch.from_numpy(cu)
        if self.provenance:
            a, b = int(sc.row_ptr[lo]), int(sc.row_ptr[hi])
            rows = np.repeat(np.arange(hi - lo), np.diff(sc.row_ptr[lo:hi + 1]))
            batch["pieces"] = np.stack([rows, sc.piece_shard[a:b], sc.piece_off[a:b],
                                        sc.piece_len[a:b], sc.piece_bos[a:b]], axis=1)
        self.step += 1
        return batch

    def __iter__(self) -> Iterator[dict]:
        while self.step < self.num_steps:
            yield self.next_batch()

    def summary(self) -> list[dict]:
        """Simulate the whole run (plans only, no copies) from step 0 on a copy of the
        state; per source: rows, shard tokens read, BOS tokens prepended, realized
        share of rows, document passes (epochs, fractional)."""
        saved = self.state_dict()
        self.reset()
        sc, n_src = self.schedule, len(self.source_names)
        rows, read, added = (np.zeros(n_src, np.int64) for _ in range(3))
        try:
            for step in range(self.num_steps):
                n_p = sc.plan(step)
                rows += np.bincount(sc.row_src, minlength=n_src)
                src_of_piece = np.repeat(sc.row_src, np.diff(sc.row_ptr))[:n_p]
                read += np.bincount(src_of_piece, weights=sc.piece_len[:n_p],
                                    minlength=n_src).astype(np.int64)
                added += np.bincount(src_of_piece, weights=sc.piece_bos[:n_p],
                                     minlength=n_src).astype(np.int64)
            epochs, pos = sc.epoch.copy(), sc.pos.copy()
        finally:
            self.load_state_dict(saved)
        out = []
        total_rows = max(int(rows.sum()), 1)
        docs = self.documents
        for i, n in enumerate(self.source_names):
            nd = int(docs.src_hi[i] - docs.src_lo[i])
            out.append({"source": n, "rows": int(rows[i]), "share": rows[i] / total_rows,
                        "tokens_read": int(read[i]), "bos_added": int(added[i]),
                        "passes": float(epochs[i] + (pos[i] / nd if nd else 0.0))})
        return out
