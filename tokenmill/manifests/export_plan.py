"""What every export writes: a training mix's documents, in the loader's order, by split.

Each export format (:mod:`tokenmill.manifests.export`) writes the same *sequences*, so
that a trainer reading any of them sees the token stream
:class:`tokenmill.train.data.MixLoader` yields for the same manifest, ``seq_len``, global
``batch_size`` and ``remainder``:

* **train, per document**: the loader's rows of ``seq_len + 1`` tokens, step after step,
  cut into their *pieces*: a whole document, the head of one cut at the row's end, or
  (opening a row) a cut document's tail with the EOT token prepended. Each piece is one
  exported sequence; every one starts with EOT; concatenated they are the loader's stream.
* **val, per document**: every val document, whole, in manifest order.
* **packed** (``packed=True``): the loader's rows themselves, ``seq_len + 1`` tokens each,
  for train and for val (one in-order pass over val, as ``MixLoader(split="val")``).

Every sequence carries its document key, its mix source and ``doc_offset`` (the offset of
its first shard token in the original document: > 0 only for a tail). The digests of a
split (:class:`StreamDigest`) do not depend on the format, so an export can be read back
and compared with its ``export.json``, and with the mix itself, whatever its layout.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.manifests.mixschema import TrainingMixManifest
from tokenmill.manifests.schedule import MixDocuments, MixSchedule, load_documents
from tokenmill.manifests.verify import OpenedShards, open_shards

DEFAULT_SEQ_LEN = 2048  # modded-nanogpt's max_seq_len for BOS-aligned sequences
DEFAULT_SHARD_TOKENS = 100_000_000  # FineWeb's shards hold 10^8 tokens


@dataclass
class Pieces:
    """A split's exported sequences in stream order: ``length`` tokens from ``offset`` of
    shard ``shard`` (indices into :class:`MixDocuments`), preceded by an EOT when ``bos``;
    ``doc`` is the source document, ``src`` the mix source index. All int64 [n]."""

    shard: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    bos: np.ndarray
    doc: np.ndarray
    src: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """Exported tokens per piece (EOT prepended included), int64 [n]."""
        return self.length + self.bos


@dataclass
class Chunk:
    """Consecutive exported sequences of one split: ``tokens`` (int64 [n_tokens], all
    sequences back to back), ``lengths`` (int64 [n_seq]) and per sequence its document
    ``keys``, mix ``sources`` and ``doc_offsets``."""

    tokens: np.ndarray
    lengths: np.ndarray
    keys: list[str]
    sources: list[str]
    doc_offsets: list[int]

    @property
    def offsets(self) -> np.ndarray:
        """Start of each sequence in ``tokens``, int64 [n_seq]."""
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)


@dataclass
class StreamDigest:
    """Format-independent digests of a split: sha256 of its tokens (uint32 little-endian,
    back to back) and of its sequence lengths (uint64 little-endian)."""

    tokens: int = 0
    sequences: int = 0
    _tok: object = field(default_factory=hashlib.sha256, repr=False)
    _len: object = field(default_factory=hashlib.sha256, repr=False)

    def update(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Add sequences (tokens back to back, their lengths) in stream order."""
        self._tok.update(np.ascontiguousarray(tokens, dtype="<u4").tobytes())
        self._len.update(np.ascontiguousarray(lengths, dtype="<u8").tobytes())
        self.tokens += int(tokens.size)
        self.sequences += int(lengths.size)

    def as_dict(self) -> dict:
        """The ``export.json`` entry of the split."""
        return {"tokens": self.tokens, "sequences": self.sequences,
                "tokens_sha256": self._tok.hexdigest(), "lengths_sha256": self._len.hexdigest()}


@dataclass(frozen=True)
class LoaderSettings:
    """The :class:`~tokenmill.train.data.MixLoader` settings an export follows."""

    seq_len: int = DEFAULT_SEQ_LEN
    batch_size: int = 1
    remainder: str = "carry"
    packed: bool = False

    def __post_init__(self) -> None:
        if self.remainder not in ("carry", "drop"):
            raise ValueError(f"remainder must be 'carry' or 'drop', not {self.remainder!r}")
        if self.seq_len < 1 or self.batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, not {self.seq_len} and "
                             f"{self.batch_size}")


def open_mix(manifest_path: str | os.PathLike, verify: bool = True) -> OpenedShards:
    """Open a training-mix manifest for export: every shard and sidecar it lists is checked
    against it first (``verify=False`` skips only the sha256 comparison). The one place
    where exports read a mix and its tokenizer identity.

    Raises:
        ShardVerifyError: the manifest is missing or of another kind, or a shard is
            missing, truncated or differs from the manifest (names the files).
    """
    return open_shards(manifest_path, None, kind="training-mix", verify=verify)


def _schedule_pieces(m: TrainingMixManifest, docs: MixDocuments, split: str,
                     settings: LoaderSettings) -> Pieces:
    """The loader's schedule for every step of ``split``, flattened in row order."""
    sched = MixSchedule(m, docs, split, settings.seq_len, settings.batch_size,
                        carry_all=settings.remainder == "carry")
    parts: list[list[np.ndarray]] = [[] for _ in range(6)]
    for step in range(sched.num_steps()):
        n = sched.plan(step)
        src = np.repeat(sched.row_src, np.diff(sched.row_ptr))[:n]
        for lst, a in zip(parts, (sched.piece_shard, sched.piece_off, sched.piece_len,
                                  sched.piece_bos, sched.piece_doc, src), strict=True):
            lst.append(a[:n].copy())
    cols = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
    return Pieces(*cols)


def _val_sources(m: TrainingMixManifest, doc: np.ndarray) -> np.ndarray:
    """Mix source index of each val document index (val documents are in source order)."""
    counts = [sum(sh.range_documents for sh in s.val_shards) for s in m.sources]
    return np.searchsorted(np.cumsum(counts), doc, side="right").astype(np.int64)


def split_pieces(m: TrainingMixManifest, docs: MixDocuments, split: str,
                 settings: LoaderSettings) -> Pieces:
    """The pieces ``split`` exports (module docstring)."""
    if split == "train" or settings.packed:
        pieces = _schedule_pieces(m, docs, split, settings)
    else:
        n = len(docs.doc_len)
        pieces = Pieces(shard=docs.doc_shard, offset=docs.doc_off, length=docs.doc_len,
                        bos=np.zeros(n, np.int64), doc=np.arange(n, dtype=np.int64),
                        src=np.zeros(n, np.int64))
    if split == "val":
        pieces.src = _val_sources(m, pieces.doc)
    return pieces


def chunk_runs(lens: np.ndarray, shard_tokens: int) -> list[slice]:
    """Sequence-aligned runs of at most ``shard_tokens`` tokens (a longer sequence gets a
    run of its own)."""
    out, start, size = [], 0, 0
    for j, n in enumerate(lens.tolist()):
        if size and size + n > shard_tokens:
            out.append(slice(start, j))
            start, size = j, 0
        size += n
    if start < len(lens):
        out.append(slice(start, len(lens)))
    return out


def materialize(pieces: Pieces, run: slice, docs: MixDocuments, names: list[str],
                keys: list[list[str]], eot: int) -> Chunk:
    """The tokens and provenance of pieces ``run``."""
    lens = pieces.tokens[run]
    tokens = np.empty(int(lens.sum()), np.int64)
    doc_keys, srcs, doc_offs = [], [], []
    o = 0
    for j, a, n, bos, d, i in zip(pieces.shard[run].tolist(), pieces.offset[run].tolist(),
                                  pieces.length[run].tolist(), pieces.bos[run].tolist(),
                                  pieces.doc[run].tolist(), pieces.src[run].tolist(),
                                  strict=True):
        if bos:
            tokens[o] = eot
        tokens[o + bos:o + bos + n] = docs.shards[j][a:a + n]
        o += bos + n
        doc_keys.append(keys[j][int(docs.doc_row[d])])
        srcs.append(names[i])
        doc_offs.append(a - int(docs.doc_off[d]))
    return Chunk(tokens=tokens, lengths=lens.astype(np.int64), keys=doc_keys, sources=srcs,
                 doc_offsets=doc_offs)


@dataclass
class SplitStream:
    """One split of an export: its pieces and how to read them chunk by chunk."""

    split: str
    pieces: Pieces
    docs: MixDocuments
    names: list[str]
    eot: int

    row_tokens: int | None = None  # the loader's row length, when the pieces fill rows
    packed: bool = False  # one sequence per row instead of one per piece

    def _row_starts(self) -> np.ndarray:
        """Index of the piece opening each row, int64 [n_rows + 1] with the end."""
        ends = np.cumsum(self.pieces.tokens)
        starts = np.concatenate([[0], ends[:-1]])
        return np.append(np.flatnonzero(starts % self.row_tokens == 0), len(ends))

    def runs(self, shard_tokens: int, align_rows: bool = False) -> list[slice]:
        """Sequence-aligned runs of pieces of at most ``shard_tokens`` tokens; with
        ``align_rows`` (always when packed) runs hold whole loader rows."""
        if self.row_tokens is None or not (align_rows or self.packed):
            return chunk_runs(self.pieces.tokens, shard_tokens)
        first = self._row_starts()
        rows = chunk_runs(np.full(len(first) - 1, self.row_tokens), shard_tokens)
        return [slice(int(first[r.start]), int(first[r.stop])) for r in rows]

    def chunks(self, shard_tokens: int, align_rows: bool = False) -> Iterator[Chunk]:
        """The split's sequences, ``shard_tokens`` tokens at most per chunk; packed, each
        row names the document, source and doc_offset of its first piece."""
        keys = self.docs.keys()
        for run in self.runs(shard_tokens, align_rows):
            ch = materialize(self.pieces, run, self.docs, self.names, keys, self.eot)
            if self.packed:
                opens = np.flatnonzero(ch.offsets % self.row_tokens == 0).tolist()
                ch = Chunk(tokens=ch.tokens,
                           lengths=np.full(len(opens), self.row_tokens, np.int64),
                           keys=[ch.keys[j] for j in opens],
                           sources=[ch.sources[j] for j in opens],
                           doc_offsets=[ch.doc_offsets[j] for j in opens])
            yield ch


def split_streams(opened: OpenedShards, splits: tuple[str, ...], settings: LoaderSettings
                  ) -> Iterator[SplitStream]:
    """A :class:`SplitStream` per split of an opened mix (shards already verified)."""
    m: TrainingMixManifest = opened.manifest
    names = [s.name for s in m.sources]
    for split in splits:
        docs = load_documents(m, Path(opened.root), split, verify=False)  # checked on open
        yield SplitStream(split=split, pieces=split_pieces(m, docs, split, settings),
                          docs=docs, names=names, eot=int(m.tokenizer.eot_token),
                          row_tokens=settings.seq_len + 1
                          if split == "train" or settings.packed else None,
                          packed=settings.packed)


def per_source(m: TrainingMixManifest, pieces: Pieces) -> dict[str, dict]:
    """Tokens, sequences and share of each mix source in a split's pieces."""
    lens = pieces.tokens
    total = int(lens.sum())
    out = {}
    for i, s in enumerate(m.sources):
        t = int(lens[pieces.src == i].sum())
        out[s.name] = {"tokens": t, "documents": int((pieces.src == i).sum()),
                       "share": t / total if total else 0.0,
                       "effective_weight": s.effective_weight}
    return out
