"""The training data loader: batches from a training datamix manifest.

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
below), ``verify=True`` (sha256 of every shard against the manifest).

Semantics
=========
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

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numba
import numpy as np
from numba import njit

from tokenmill.atomic import sha256_file
from tokenmill.manifests.mix import TrainingMixManifest, load_mix_manifest
from tokenmill.manifests.shards import read_header, read_sidecar, read_tokens

STATE_VERSION = 1

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * _M2
    z = (z ^ (z >> np.uint64(27))) * _M3
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _key(seed, a, b):
    """A splitmix64 key for (seed, a, b); all uint64."""
    k = _mix64(seed + _M1)
    k = _mix64(k ^ (a * _M2 + _M1))
    return _mix64(k ^ (b * _M3 + _M1))


@njit(cache=True)
def _shuffle_range(perm, lo, hi, key):
    """perm[lo:hi] = a Fisher-Yates permutation of lo..hi-1 driven by splitmix64(key)."""
    for k in range(lo, hi):
        perm[k] = k
    x = key
    for k in range(hi - 1, lo, -1):
        x = x + _M1
        r = _mix64(x)
        j = lo + np.int64(r % np.uint64(k - lo + 1))
        t = perm[k]
        perm[k] = perm[j]
        perm[j] = t


@njit(cache=True)
def _shuffle_small(a, key):
    x = key
    for k in range(a.shape[0] - 1, 0, -1):
        x = x + _M1
        r = _mix64(x)
        j = np.int64(r % np.uint64(k + 1))
        t = a[k]
        a[k] = a[j]
        a[j] = t


@njit(cache=True)
def _plan_step(step, B, T1, carry_all, shuffle, seed, seg_row_start, seg_w, credits,
               tie_order, src_lo, src_hi, doc_shard, doc_off, doc_len, perm, epoch, pos,
               carry_doc, carry_off, row_src, piece_shard, piece_off, piece_len, piece_bos,
               row_ptr):
    """Plan one global step: assign sources to its B rows and pack each row.

    Mutates credits / perm / epoch / pos / carry_* (the resumable state) and fills
    row_src[B], row_ptr[B+1] and the piece arrays. Returns the number of pieces.
    """
    n_src = credits.shape[0]
    # 1. sources of the rows: smooth weighted round-robin over the segment's weights
    for j in range(B):
        g = step * B + j
        seg = 0
        while seg + 1 < seg_row_start.shape[0] and seg_row_start[seg + 1] <= g:
            seg += 1
        best = -1
        for t in range(n_src):
            i = tie_order[t]
            w = seg_w[seg, i]
            if w > 0.0:
                credits[i] += w
                if best < 0 or credits[i] > credits[best]:
                    best = i
        credits[best] -= 1.0
        row_src[j] = best
    if shuffle:
        _shuffle_small(row_src, _key(seed, np.uint64(0xFFFFFFFF), np.uint64(step)))
    # 2. pack each row from its source's document stream
    n_p = 0
    for j in range(B):
        row_ptr[j] = n_p
        i = row_src[j]
        lo = src_lo[i]
        n_docs = src_hi[i] - lo
        filled = 0
        first = True
        while filled < T1:
            if first and carry_doc[i] >= 0:
                d = carry_doc[i]
                o = carry_off[i]
                bos = 1
            else:
                if pos[i] == n_docs:
                    epoch[i] += 1
                    pos[i] = 0
                    if shuffle:
                        _shuffle_range(perm, lo, lo + n_docs,
                                       _key(seed, np.uint64(i + 1), np.uint64(epoch[i])))
                d = perm[lo + pos[i]]
                pos[i] += 1
                o = 0
                bos = 0
            carry_doc[i] = -1
            avail = doc_len[d] - o
            space = T1 - filled
            piece_shard[n_p] = doc_shard[d]
            piece_off[n_p] = doc_off[d] + o
            piece_bos[n_p] = bos
            if bos + avail <= space:
                piece_len[n_p] = avail
                filled += bos + avail
            else:
                take = space - bos
                piece_len[n_p] = take
                filled = T1
                if carry_all or first:
                    carry_doc[i] = d
                    carry_off[i] = o + take
            n_p += 1
            first = False
    row_ptr[B] = n_p
    return n_p


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


@njit(cache=True)
def _rows_one_pass(doc_len, T1, carry_all):
    """Complete rows one in-order pass over documents gives (val split)."""
    rows = 0
    filled = 0
    for d in range(doc_len.shape[0]):
        o = 0
        bos = 0
        while True:
            avail = doc_len[d] - o
            space = T1 - filled
            if bos + avail <= space:
                filled += bos + avail
                if filled == T1:
                    rows += 1
                    filled = 0
                break
            take = space - bos
            first = filled == 0
            rows += 1
            filled = 0
            if carry_all or first:
                o += take
                bos = 1
            else:
                break
    return rows


@dataclass
class MixDocuments:
    """The documents a training datamix manifest allows, per source (or one "val" group).

    Document ``d`` is tokens ``[doc_off[d], doc_off[d] + doc_len[d])`` of shard
    ``doc_shard[d]`` (an index into ``shard_paths`` / ``shards``, the memory-mapped
    token arrays) and row ``doc_row[d]`` of that shard's sidecar; source ``i`` owns
    documents ``src_lo[i]:src_hi[i]``. All int64.
    """

    source_names: list[str]
    shard_paths: list[str]
    shards: list[np.ndarray]
    doc_shard: np.ndarray
    doc_off: np.ndarray
    doc_len: np.ndarray
    doc_row: np.ndarray
    src_lo: np.ndarray
    src_hi: np.ndarray


def load_documents(manifest: TrainingMixManifest, root: str | os.PathLike,
                   split: str = "train", verify: bool = False) -> MixDocuments:
    """Memory-map the shards of ``manifest`` (paths relative to ``root``) and list the
    documents inside its token ranges, checking each against its shard.

    Raises:
        FileNotFoundError: a shard is missing.
        ValueError: a header, sidecar, range or (``verify``) sha256 disagrees with the
            manifest, a document does not start with the EOT token (names file, sidecar
            row and offset), shards mix uint16 and uint32 versions, or no documents.
    """
    m = manifest
    root = Path(root)
    eot = int(m.tokenizer.eot_token)
    if split == "train":
        groups = [(s.name, s.shards) for s in m.sources]
    elif split == "val":
        groups = [("val", [sh for s in m.sources for sh in s.val_shards])]
    else:
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    paths: dict[str, int] = {}
    arrays = []
    versions = set()
    shard_of, off_of, len_of, row_of, lo, hi = [], [], [], [], [], []
    n_docs = 0
    for name, shards in groups:
        lo.append(n_docs)
        for sh in shards:
            p = (root / sh.path).resolve()
            key = str(p)
            if not p.exists():
                raise FileNotFoundError(f"shard {p} of source {name!r} not found")
            h = read_header(p)
            if h.n_tokens != sh.tokens:
                raise ValueError(f"{p}: header has {h.n_tokens} tokens, manifest {sh.tokens}")
            if verify and sha256_file(p) != sh.sha256:
                raise ValueError(f"{p}: sha256 differs from the training manifest's")
            versions.add(h.version)
            if key not in paths:
                paths[key] = len(arrays)
                arrays.append(np.asarray(read_tokens(p)))
            j = paths[key]
            side = read_sidecar(p)
            off = side.column("offset").to_numpy().astype(np.int64)
            ln = side.column("n_tokens").to_numpy().astype(np.int64)
            if len(off) != sh.documents:
                raise ValueError(f"{p}: sidecar has {len(off)} documents, manifest "
                                 f"{sh.documents}")
            keep = np.flatnonzero((off >= sh.start) & (off + ln <= sh.end))
            off, ln = off[keep], ln[keep]
            if len(off) != sh.range_documents or int(ln.sum()) != sh.range_tokens:
                raise ValueError(f"{p}: range [{sh.start}, {sh.end}) holds {len(off)} "
                                 f"documents / {int(ln.sum())} tokens, manifest says "
                                 f"{sh.range_documents} / {sh.range_tokens}")
            if (ln < 1).any():
                raise ValueError(f"{p}: sidecar row {int(keep[np.argmin(ln)])} has 0 tokens")
            toks = arrays[j][off] if len(off) else np.zeros(0, np.int64)
            bad = np.flatnonzero(toks != eot)
            if bad.size:
                b = int(bad[0])
                raise ValueError(f"{p}: document at sidecar row {int(keep[b])} (offset "
                                 f"{int(off[b])}) starts with token {int(toks[b])}, not EOT "
                                 f"{eot}")
            shard_of.append(np.full(len(off), j, np.int64))
            off_of.append(off)
            len_of.append(ln)
            row_of.append(keep.astype(np.int64))
            n_docs += len(off)
        hi.append(n_docs)
    if len(versions) > 1:
        raise ValueError(f"shards mix versions {sorted(versions)} (uint16 and uint32)")
    if n_docs == 0:
        raise ValueError(f"no {split} documents in the manifest")

    def cat(xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(0, np.int64)

    return MixDocuments(
        source_names=[g[0] for g in groups], shard_paths=list(paths), shards=arrays,
        doc_shard=cat(shard_of), doc_off=cat(off_of), doc_len=cat(len_of),
        doc_row=cat(row_of), src_lo=np.array(lo, np.int64), src_hi=np.array(hi, np.int64))


class MixLoader:
    """Batches from a training datamix manifest (see the module docstring).

    Args:
        manifest: path of a training datamix manifest (``tokenmill mix build``) or the
            model itself (then ``root`` is the folder its paths are relative to).
        seq_len: T, tokens per row of inputs (rows hold T + 1 tokens).
        batch_size: global rows per step, a multiple of ``world_size``.
        world_size, rank: this process's share of every step.
        split: ``"train"`` (the mixture) or ``"val"`` (all val shards, one pass, in order).
        dtype: ``np.int64`` (default) or ``np.int32`` for inputs and targets.
        output: ``"numpy"`` or ``"torch"``; ``pin_memory`` pins torch tensors (if CUDA).
        remainder: ``"carry"`` or ``"drop"`` (what happens to a split document's tail).
        state: a ``state_dict()`` to resume from.
        max_steps: stop earlier than the manifest's budget.
        verify: check each shard's sha256 against the manifest (reads every byte).
        provenance: add ``pieces`` to each batch.

    Raises:
        ValueError: bad sizes, a state from another configuration, a shard whose header,
            sha256 or document offsets disagree with the manifest (naming the file), a
            document not starting with the EOT token (naming file and row), mixed shard
            versions.
        FileNotFoundError: a shard is missing.
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
        verify: bool = False,
        provenance: bool = False,
        root: str | os.PathLike | None = None,
    ) -> None:
        if isinstance(manifest, TrainingMixManifest):
            self.manifest = manifest
            self.root = Path(root) if root is not None else Path.cwd()
        else:
            self.manifest = load_mix_manifest(manifest)
            self.root = Path(manifest).resolve().parent
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
        self.seq_len, self.batch_size = int(seq_len), int(batch_size)
        self.world_size, self.rank = int(world_size), int(rank)
        self.local_batch = self.batch_size // self.world_size
        self.split = split
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
            raise ValueError(f"dtype must be int64 or int32, not {self.dtype}")
        self.output, self.pin_memory = output, pin_memory
        self.remainder = remainder
        self.provenance = provenance
        self.eot = int(self.manifest.tokenizer.eot_token)
        self.seed = np.uint64(self.manifest.seed & 0xFFFFFFFFFFFFFFFF)
        self._load_documents(verify)
        self._init_schedule()
        n = self.batch_size
        cap = n * (self.seq_len + 1)
        self._row_src = np.zeros(n, np.int64)
        self._row_ptr = np.zeros(n + 1, np.int64)
        self._p_shard = np.zeros(cap, np.int64)
        self._p_off = np.zeros(cap, np.int64)
        self._p_len = np.zeros(cap, np.int64)
        self._p_bos = np.zeros(cap, np.int64)
        if split == "train":
            steps = self.manifest.total_tokens // (self.batch_size * (self.seq_len + 1))
        else:
            rows = _rows_one_pass(self._doc_len, self.seq_len + 1, remainder == "carry")
            steps = rows // self.batch_size
        self.num_steps = int(steps if max_steps is None else min(steps, max_steps))
        self.reset()
        if state is not None:
            self.load_state_dict(state)

    # ------------------------------------------------------------------ setup
    def _load_documents(self, verify: bool) -> None:
        docs = load_documents(self.manifest, self.root, self.split, verify)
        self.documents = docs
        self.source_names = docs.source_names
        self.shard_paths = docs.shard_paths
        self._shards = numba.typed.List(docs.shards)
        self._doc_shard, self._doc_off, self._doc_len = docs.doc_shard, docs.doc_off, docs.doc_len
        self._src_lo, self._src_hi = docs.src_lo, docs.src_hi
        if self.split == "train":
            for s, a, b in zip(self.manifest.sources, self._src_lo, self._src_hi, strict=True):
                if a == b and s.granted_tokens > 0:
                    raise ValueError(f"source {s.name!r} has granted tokens but no documents")

    def _init_schedule(self) -> None:
        n_src = len(self.source_names)
        if self.split == "train":
            segs = self.manifest.segments
            self._seg_row_start = np.array(
                [math.ceil(s.start_token / (self.seq_len + 1)) for s in segs], np.int64)
            self._seg_w = np.array([[s.weights.get(n, 0.0) for n in self.source_names]
                                    for s in segs], np.float64)
            for i in range(len(self.source_names)):  # sources with no documents
                if self._src_hi[i] == self._src_lo[i]:
                    self._seg_w[:, i] = 0.0
        else:
            self._seg_row_start = np.zeros(1, np.int64)
            self._seg_w = np.ones((1, 1), np.float64)
        order = np.arange(n_src, dtype=np.int64)
        if self.split == "train":
            _shuffle_small(order, np.uint64(_key(self.seed, np.uint64(0xFFFFFFFE),
                                                 np.uint64(0))))
        self._tie_order = order

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Go back to step 0."""
        n_src = len(self.source_names)
        self.step = 0
        self._credits = np.zeros(n_src, np.float64)
        self._epoch = np.zeros(n_src, np.int64)
        self._pos = np.zeros(n_src, np.int64)
        self._carry_doc = np.full(n_src, -1, np.int64)
        self._carry_off = np.zeros(n_src, np.int64)
        self._perm = np.arange(self._doc_len.shape[0], dtype=np.int64)
        self._reshuffle()

    def _reshuffle(self) -> None:
        if self.split != "train":
            self._perm = np.arange(self._doc_len.shape[0], dtype=np.int64)
            return
        for i in range(len(self.source_names)):
            key = np.uint64(_key(self.seed, np.uint64(i + 1), np.uint64(self._epoch[i])))
            _shuffle_range(self._perm, self._src_lo[i], self._src_hi[i], key)

    def _config(self) -> dict:
        return {"name": self.manifest.name, "spec_sha256": self.manifest.spec_sha256,
                "split": self.split, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "remainder": self.remainder, "sources": list(self.source_names)}

    def state_dict(self) -> dict:
        """JSON-serializable state after the last yielded batch (rank-independent)."""
        return {
            "version": STATE_VERSION,
            "config": self._config(),
            "step": int(self.step),
            "cursors": [
                {"source": n, "epoch": int(self._epoch[i]), "position": int(self._pos[i]),
                 "carry_document": int(self._carry_doc[i]),
                 "carry_offset": int(self._carry_off[i])}
                for i, n in enumerate(self.source_names)],
            "credits": [float(c) for c in self._credits],
        }

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
        cur = state["cursors"]
        self.step = int(state["step"])
        self._epoch = np.array([c["epoch"] for c in cur], np.int64)
        self._pos = np.array([c["position"] for c in cur], np.int64)
        self._carry_doc = np.array([c["carry_document"] for c in cur], np.int64)
        self._carry_off = np.array([c["carry_offset"] for c in cur], np.int64)
        self._credits = np.array(state["credits"], np.float64)
        self._reshuffle()

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.num_steps

    def _plan(self) -> int:
        return _plan_step(
            self.step, self.batch_size, self.seq_len + 1, self.remainder == "carry",
            self.split == "train", self.seed, self._seg_row_start, self._seg_w,
            self._credits, self._tie_order, self._src_lo, self._src_hi, self._doc_shard,
            self._doc_off, self._doc_len, self._perm, self._epoch, self._pos,
            self._carry_doc, self._carry_off, self._row_src, self._p_shard, self._p_off,
            self._p_len, self._p_bos, self._row_ptr)

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
        self._plan()
        lo, hi = self.rank * self.local_batch, (self.rank + 1) * self.local_batch
        shape = (self.local_batch, self.seq_len)
        x, xn = self._alloc(shape, self.dtype)
        y, yn = self._alloc(shape, self.dtype)
        n_p = int(self._row_ptr[hi] - self._row_ptr[lo])
        cu = np.empty(n_p + 1, np.int32)
        n_cu = _fill(self._shards, self.eot, self.seq_len, lo, hi, self._row_ptr,
                     self._p_shard, self._p_off, self._p_len, self._p_bos, xn, yn, cu)
        cu = cu[:n_cu]
        batch: dict[str, Any] = {
            "step": self.step,
            "inputs": x,
            "targets": y,
            "cu_seqlens": cu,
            "max_seqlen": int(np.diff(cu).max()) if n_cu > 1 else 0,
            "sources": self._row_src[lo:hi].astype(np.int16),
        }
        if self.output == "torch":
            import torch

            batch["cu_seqlens"] = torch.from_numpy(cu)
        if self.provenance:
            a, b = int(self._row_ptr[lo]), int(self._row_ptr[hi])
            rows = np.repeat(np.arange(hi - lo), np.diff(self._row_ptr[lo:hi + 1]))
            batch["pieces"] = np.stack([rows, self._p_shard[a:b], self._p_off[a:b],
                                        self._p_len[a:b], self._p_bos[a:b]], axis=1)
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
        n_src = len(self.source_names)
        rows = np.zeros(n_src, np.int64)
        read = np.zeros(n_src, np.int64)
        added = np.zeros(n_src, np.int64)
        try:
            for _ in range(self.num_steps):
                n_p = self._plan()
                rows += np.bincount(self._row_src, minlength=n_src)
                per_row = np.diff(self._row_ptr)
                src_of_piece = np.repeat(self._row_src, per_row)[:n_p]
                read += np.bincount(src_of_piece, weights=self._p_len[:n_p],
                                    minlength=n_src).astype(np.int64)
                added += np.bincount(src_of_piece, weights=self._p_bos[:n_p],
                                     minlength=n_src).astype(np.int64)
                self.step += 1
            epochs = self._epoch.copy()
            pos = self._pos.copy()
        finally:
            self.load_state_dict(saved)
        out = []
        total_rows = max(int(rows.sum()), 1)
        for i, n in enumerate(self.source_names):
            nd = int(self._src_hi[i] - self._src_lo[i])
            out.append({"source": n, "rows": int(rows[i]), "share": rows[i] / total_rows,
                        "tokens_read": int(read[i]), "bos_added": int(added[i]),
                        "passes": float(epochs[i] + (pos[i] / nd if nd else 0.0))})
        return out
