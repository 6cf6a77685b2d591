"""The one mixing schedule: which document fills which row, in which order.

A training-mix manifest (:mod:`tokenmill.manifests.mixschema`, planned by
:func:`tokenmill.manifests.mix.plan_mix`) says how many tokens of each source a run
reads and with which effective weights along the stream. This module turns it into
the exact per-document schedule that both the trainer's loader
(:class:`tokenmill.train.data.MixLoader`) and the modded-nanogpt exporter
(:func:`tokenmill.manifests.export.export_modded_nanogpt`) follow, so the exported files
hold exactly the token sequence the loader yields for the same mix, seed, row length and
global batch.

* **Rows.** A step is ``batch_size`` rows of ``seq_len + 1`` tokens. Each row is
  filled from one source; sources are assigned to rows by smooth weighted round-robin
  (nginx's SWRR, a deterministic deficit scheduler) over the manifest's effective
  per-segment weights, so after any number of rows each source's share of rows is within
  one row of its weight; the rows of each step are then permuted with the seed.
* **Documents.** Each source's documents (only those inside the manifest's token
  ranges) are read in a seeded random order, reshuffled every epoch (Fisher-Yates driven
  by a splitmix64 stream keyed by seed, source and epoch). A row starts at a document
  start (its EOT/BOS token) and packs whole documents. The document that does not fit
  in the rest of a row is split: its head closes the row and, with ``carry_all``
  (``remainder="carry"``), its tail opens the source's next row with the BOS/EOT token
  prepended; otherwise the tail is dropped, except for a document longer than a whole
  row, whose rest is always carried.
* **Val.** One in-order pass over all val documents, no shuffling.

The plan of a step is a list of *pieces* ``(shard, offset, length, bos, document)`` in
row order: ``length`` tokens from ``offset`` of shard ``shard``, preceded by one
BOS/EOT token when ``bos`` is 1.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from tokenmill import objectcache
from tokenmill.manifests.mixschema import TrainingMixManifest
from tokenmill.manifests.shards import read_sidecar, read_tokens
from tokenmill.manifests.verify import VerifiedShard, check_shards

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
ROW_SHUFFLE = np.uint64(0xFFFFFFFF)  # stream_key(seed, ROW_SHUFFLE, step): a step's rows
TIE_SHUFFLE = np.uint64(0xFFFFFFFE)  # stream_key(seed, TIE_SHUFFLE, 0): SWRR tie order


@njit(cache=True, inline="always")
def mix64(z):
    """splitmix64's finalizer (Steele, Lea and Flood 2014) on a uint64."""
    z = (z ^ (z >> np.uint64(30))) * _M2
    z = (z ^ (z >> np.uint64(27))) * _M3
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def stream_key(seed, a, b):
    """A splitmix64 key for (seed, a, b); all uint64. Source ``i``'s epoch ``e`` order
    uses ``(seed, i + 1, e)``."""
    k = mix64(seed + _M1)
    k = mix64(k ^ (a * _M2 + _M1))
    return mix64(k ^ (b * _M3 + _M1))


@njit(cache=True)
def shuffle_range(perm, lo, hi, key):
    """perm[lo:hi] = a Fisher-Yates permutation of lo..hi-1 driven by splitmix64(key)."""
    for k in range(lo, hi):
        perm[k] = k
    x = key
    for k in range(hi - 1, lo, -1):
        x = x + _M1
        r = mix64(x)
        j = lo + np.int64(r % np.uint64(k - lo + 1))
        t = perm[k]
        perm[k] = perm[j]
        perm[j] = t


@njit(cache=True)
def shuffle_small(a, key):
    """Fisher-Yates shuffle of the int64 array ``a`` in place, driven by splitmix64(key)."""
    x = key
    for k in range(a.shape[0] - 1, 0, -1):
        x = x + _M1
        r = mix64(x)
        j = np.int64(r % np.uint64(k + 1))
        t = a[k]
        a[k] = a[j]
        a[j] = t


@njit(cache=True)
def _assign_rows(step, B, shuffle, seed, seg_row_start, seg_w, credits, tie_order, row_src):
    """Sources of the B rows of ``step``: SWRR over the segment's weights, then a seeded
    permutation of the step's rows. Mutates ``credits``."""
    n_src = credits.shape[0]
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
        shuffle_small(row_src, stream_key(seed, ROW_SHUFFLE, np.uint64(step)))


@njit(cache=True)
def plan_step(step, B, T1, carry_all, shuffle, seed, seg_row_start, seg_w, credits,
              tie_order, src_lo, src_hi, doc_shard, doc_off, doc_len, perm, epoch, pos,
              carry_doc, carry_off, row_src, piece_shard, piece_off, piece_len, piece_bos,
              piece_doc, row_ptr):
    """Plan one global step: assign sources to its B rows and pack each row of T1 tokens.

    Mutates credits / perm / epoch / pos / carry_* (the resumable state) and fills
    row_src[B], row_ptr[B+1] and the piece arrays (see the module docstring). Returns
    the number of pieces.
    """
    _assign_rows(step, B, shuffle, seed, seg_row_start, seg_w, credits, tie_order, row_src)
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
                        shuffle_range(perm, lo, lo + n_docs,
                                      stream_key(seed, np.uint64(i + 1), np.uint64(epoch[i])))
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
            piece_doc[n_p] = d
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
def rows_one_pass(doc_len, T1, carry_all):
    """Complete rows of T1 tokens that one in-order pass over documents gives (val)."""
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


# ------------------------------------------------------------------------------ documents


@dataclass
class MixDocuments:
    """The documents a training-mix manifest allows, per source (or one "val" group).

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

    def keys(self) -> list[list[str]]:
        """Sidecar document keys per shard (index as ``keys()[doc_shard[d]][doc_row[d]]``)."""
        return [read_sidecar(p).column("key").to_pylist() for p in self.shard_paths]


def _groups(m: TrainingMixManifest, split: str) -> list[tuple[str, list]]:
    if split == "train":
        return [(s.name, list(s.shards)) for s in m.sources]
    if split == "val":
        return [("val", [sh for s in m.sources for sh in s.val_shards])]
    raise ValueError(f"split must be 'train' or 'val', not {split!r}")


def _range_documents(p: Path, sh, tokens: np.ndarray, eot: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sidecar rows, offsets, lengths) of the documents inside the shard entry's range,
    checked against the entry and the tokens."""
    side = read_sidecar(p)
    off = side.column("offset").to_numpy().astype(np.int64)
    ln = side.column("n_tokens").to_numpy().astype(np.int64)
    if len(off) != sh.documents:
        raise ValueError(f"{p}: sidecar has {len(off)} documents, manifest {sh.documents}")
    keep = np.flatnonzero((off >= sh.start) & (off + ln <= sh.end))
    off, ln = off[keep], ln[keep]
    if len(off) != sh.range_documents or int(ln.sum()) != sh.range_tokens:
        raise ValueError(f"{p}: range [{sh.start}, {sh.end}) holds {len(off)} documents / "
                         f"{int(ln.sum())} tokens, manifest says {sh.range_documents} / "
                         f"{sh.range_tokens}")
    if (ln < 1).any():
        raise ValueError(f"{p}: sidecar row {int(keep[np.argmin(ln)])} has 0 tokens")
    toks = tokens[off] if len(off) else np.zeros(0, np.int64)
    bad = np.flatnonzero(toks != eot)
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{p}: document at sidecar row {int(keep[b])} (offset {int(off[b])}) "
                         f"starts with token {int(toks[b])}, not EOT {eot}")
    return keep.astype(np.int64), off, ln


def load_documents(manifest: TrainingMixManifest, root: str | os.PathLike,
                   split: str = "train", verify: bool = True) -> MixDocuments:
    """Check and memory-map the shards of ``manifest`` (paths relative to ``root``) and
    list the documents inside its token ranges.

    Raises:
        ShardVerifyError: a shard or sidecar is missing, truncated, its header disagrees
            with the manifest, or (``verify``) its sha256 differs (names the first file).
        ValueError: a sidecar or range disagrees with the manifest, a document does not
            start with the EOT token (names file, sidecar row and offset), shards mix
            uint16 and uint32 versions, or there are no documents.
    """
    root = Path(root)
    check_shards([VerifiedShard(path=objectcache.locate(root, sh.path), entry=sh, source=name)
                  for name, shards in _groups(manifest, split) for sh in shards],
                 verify=verify, what="the training-mix manifest")
    return documents_of(manifest, root, split)


def documents_of(manifest: TrainingMixManifest, root: str | os.PathLike,
                 split: str = "train") -> MixDocuments:
    """:func:`load_documents` of shards already checked (present, headers as the manifest
    says: :func:`load_documents` itself, or
    :func:`~tokenmill.manifests.verify.open_shards` of the manifest): memory-map them and
    list the documents inside the manifest's token ranges.

    Raises:
        ValueError: as :func:`load_documents`.
    """
    root = Path(root)
    eot = int(manifest.tokenizer.eot_token)
    groups = _groups(manifest, split)
    paths: dict[str, int] = {}
    arrays: list[np.ndarray] = []
    cols: dict[str, list[np.ndarray]] = {"shard": [], "off": [], "len": [], "row": []}
    lo, hi, n_docs = [], [], 0
    for _, shards in groups:
        lo.append(n_docs)
        for sh in shards:
            p = objectcache.locate(root, sh.path)
            if str(p) not in paths:
                paths[str(p)] = len(arrays)
                arrays.append(np.asarray(read_tokens(p)))
            j = paths[str(p)]
            row, off, ln = _range_documents(p, sh, arrays[j], eot)
            cols["shard"].append(np.full(len(off), j, np.int64))
            cols["off"].append(off)
            cols["len"].append(ln)
            cols["row"].append(row)
            n_docs += len(off)
        hi.append(n_docs)
    if len({a.dtype for a in arrays}) > 1:
        raise ValueError(f"shards mix uint16 and uint32 versions: {sorted(paths)}")
    if n_docs == 0:
        raise ValueError(f"no {split} documents in the manifest")

    def cat(xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(0, np.int64)

    return MixDocuments(
        source_names=[g[0] for g in groups], shard_paths=list(paths), shards=arrays,
        doc_shard=cat(cols["shard"]), doc_off=cat(cols["off"]), doc_len=cat(cols["len"]),
        doc_row=cat(cols["row"]), src_lo=np.array(lo, np.int64), src_hi=np.array(hi, np.int64))


# ------------------------------------------------------------------------------ schedule


class MixSchedule:
    """The resumable schedule of a training-mix manifest's documents into rows.

    Args:
        manifest: the training-mix manifest (its seed, segments and sources).
        docs: :func:`load_documents` of it for ``split``.
        split: ``"train"`` (the mixture, shuffled) or ``"val"`` (one in-order pass).
        seq_len: T; rows hold T + 1 tokens.
        batch_size: global rows per step.
        carry_all: ``remainder="carry"`` (a split document's tail opens the next row).

    After :meth:`plan` the arrays ``row_src`` (int64 [B]), ``row_ptr`` (int64 [B+1], the
    pieces of row r are ``row_ptr[r]:row_ptr[r+1]``) and ``piece_shard``, ``piece_off``,
    ``piece_len``, ``piece_bos``, ``piece_doc`` describe the step.
    """

    def __init__(self, manifest: TrainingMixManifest, docs: MixDocuments, split: str,
                 seq_len: int, batch_size: int, carry_all: bool = True) -> None:
        self.manifest, self.docs, self.split = manifest, docs, split
        self.seq_len, self.batch_size, self.carry_all = seq_len, batch_size, carry_all
        self.seed = np.uint64(manifest.seed & 0xFFFFFFFFFFFFFFFF)
        self._init_weights()
        n, cap = batch_size, batch_size * (seq_len + 1)
        self.row_src = np.zeros(n, np.int64)
        self.row_ptr = np.zeros(n + 1, np.int64)
        self.piece_shard, self.piece_off, self.piece_len, self.piece_bos, self.piece_doc = (
            np.zeros(cap, np.int64) for _ in range(5))
        self.reset()

    def _init_weights(self) -> None:
        docs, n_src = self.docs, len(self.docs.source_names)
        if self.split == "train":
            segs = self.manifest.segments
            self.seg_row_start = np.array(
                [math.ceil(s.start_token / (self.seq_len + 1)) for s in segs], np.int64)
            self.seg_w = np.array([[s.weights.get(n, 0.0) for n in docs.source_names]
                                   for s in segs], np.float64)
            for i in range(n_src):  # sources with no documents
                if docs.src_hi[i] == docs.src_lo[i]:
                    self.seg_w[:, i] = 0.0
        else:
            self.seg_row_start = np.zeros(1, np.int64)
            self.seg_w = np.ones((1, 1), np.float64)
        self.tie_order = np.arange(n_src, dtype=np.int64)
        if self.split == "train":
            shuffle_small(self.tie_order, np.uint64(stream_key(self.seed, TIE_SHUFFLE,
                                                               np.uint64(0))))

    def num_steps(self) -> int:
        """Steps the manifest gives: ``total_tokens // (B * (T + 1))`` (train) or the
        complete rows of one pass // B (val)."""
        if self.split == "train":
            return self.manifest.total_tokens // (self.batch_size * (self.seq_len + 1))
        return rows_one_pass(self.docs.doc_len, self.seq_len + 1, self.carry_all
                             ) // self.batch_size

    def reset(self) -> None:
        """Back to the state before step 0."""
        n_src = len(self.docs.source_names)
        self.credits = np.zeros(n_src, np.float64)
        self.epoch = np.zeros(n_src, np.int64)
        self.pos = np.zeros(n_src, np.int64)
        self.carry_doc = np.full(n_src, -1, np.int64)
        self.carry_off = np.zeros(n_src, np.int64)
        self.reshuffle()

    def reshuffle(self) -> None:
        """Rebuild each source's document order for its current epoch."""
        self.perm = np.arange(self.docs.doc_len.shape[0], dtype=np.int64)
        if self.split != "train":
            return
        for i in range(len(self.docs.source_names)):
            key = np.uint64(stream_key(self.seed, np.uint64(i + 1), np.uint64(self.epoch[i])))
            shuffle_range(self.perm, self.docs.src_lo[i], self.docs.src_hi[i], key)

    def cursors(self) -> dict:
        """The resumable state (JSON-serializable), without the step."""
        return {
            "cursors": [
                {"source": n, "epoch": int(self.epoch[i]), "position": int(self.pos[i]),
                 "carry_document": int(self.carry_doc[i]),
                 "carry_offset": int(self.carry_off[i])}
                for i, n in enumerate(self.docs.source_names)],
            "credits": [float(c) for c in self.credits],
        }

    def load_cursors(self, state: dict) -> None:
        """Restore :meth:`cursors` output."""
        cur = state["cursors"]
        self.epoch = np.array([c["epoch"] for c in cur], np.int64)
        self.pos = np.array([c["position"] for c in cur], np.int64)
        self.carry_doc = np.array([c["carry_document"] for c in cur], np.int64)
        self.carry_off = np.array([c["carry_offset"] for c in cur], np.int64)
        self.credits = np.array(state["credits"], np.float64)
        self.reshuffle()

    def plan(self, step: int) -> int:
        """Plan global step ``step`` (steps must be planned in order from the state);
        returns the number of pieces."""
        d = self.docs
        return plan_step(
            step, self.batch_size, self.seq_len + 1, self.carry_all, self.split == "train",
            self.seed, self.seg_row_start, self.seg_w, self.credits, self.tie_order,
            d.src_lo, d.src_hi, d.doc_shard, d.doc_off, d.doc_len, self.perm, self.epoch,
            self.pos, self.carry_doc, self.carry_off, self.row_src, self.piece_shard,
            self.piece_off, self.piece_len, self.piece_bos, self.piece_doc, self.row_ptr)
