"""Exact impossible-continuation table of a tiktoken tokenizer.

A pair ``(a, b)`` of token ids is *possible* if some text's canonical encoding
(``encode_ordinary``) contains ``a`` immediately followed by ``b``; otherwise it is
impossible, and a model evaluated on canonical tokenizations may give ``b`` zero probability
after ``a`` (the impossible-continuation mask of the NanoGPT speedrun records; e.g. GPT-2
``Hyper`` is never followed by ``eter`` because "Hypereter" encodes as H|ype|re|ter).

The table is built analytically from the vocabulary, never from a corpus:

* the pre-tokenizer regex decides whether the junction between ``a`` and ``b`` may be a piece
  boundary or may lie inside one piece (:mod:`tokenmill.tokenizers.legality_regex`);
* inside one piece, BPE decides (:mod:`tokenmill.tokenizers.legality_bpe`, numba, parallel
  over the previous token).

It is **sound** by construction (every uncertain case counts as possible) and checked against
tiktoken on real corpora and adversarial contexts by the tests. Special tokens (``<|endoftext|>``
...) never come out of ``encode_ordinary`` but shards put them between documents, so every
pair involving a special token counts as possible; ids that are neither mergeable nor special
(cl100k_base's unused ids) are impossible everywhere.

Storage: ``n_vocab`` rows (row = previous token) of ``ceil(n_vocab / 8)`` bytes, bit ``j % 8``
(little bit order, ``np.unpackbits(..., bitorder="little")``) of byte ``j // 8`` is 1 when next
token ``j`` is possible. On disk: 8-byte magic ``TMLEGAL1``, a uint32 header length, a JSON
header (tokenizer identity, sizes, counts, build time, and ``bit_meaning``: what a set bit
means), zero padding to 4096 bytes, then the matrix, so that :meth:`LegalityTable.load`
memory-maps it.

Interchange with modded-nanogpt (:func:`export_modded_nanogpt`): the speedrun's validation
mask (``GPT.canon_mask``, ``build_canonical_mask`` in its ``train_gpt.py``, KellerJordan/
modded-nanogpt PR #350) is ``uint8[vocab_size, vocab_size // 8]`` over the model's padded
vocabulary (``vocab_size`` = the next multiple of 128, 50,304 for GPT-2), little bit order,
and a set bit marks a *forbidden* pair (all zero = no masking). The export writes exactly that
matrix after the same 4096-byte header, whose ``bit_meaning`` says so; :meth:`LegalityTable.load`
reads the polarity from every file's header and refuses a file that does not state it.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np
import tiktoken

from tokenmill.atomic import atomic_open
from tokenmill.tokenizers import legality_bpe as kb
from tokenmill.tokenizers.identities import TokenizerIdentity
from tokenmill.tokenizers.legality_regex import model_for_pattern, pair_rule, signature_tables
from tokenmill.tokenizers.prefix import token_bytes_table
from tokenmill.tokenizers.registry import check_same, get_encoding, identity
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks, special_tokens, split_pattern

MAGIC = b"TMLEGAL1"
DATA_OFFSET = 4096
FORMAT_VERSION = 1
#: ``bit_meaning`` header values: tokenmill's own polarity and the speedrun's.
BIT_POSSIBLE = "1 = possible next token"
BIT_FORBIDDEN = "1 = impossible next token (forbidden pair)"
#: ``layout`` header value of an export for modded-nanogpt.
MODDED_NANOGPT_LAYOUT = "modded-nanogpt canon_mask: uint8[vocab_size, vocab_size // 8]"
# The NanoGPT speedrun record's canonical GPT-2 mask (sound in any context) marks this many
# pairs impossible; reported beside our count.
SPEEDRUN_GPT2_IMPOSSIBLE = 70_889_701


class LegalityFormatError(ValueError):
    """A legality table file is malformed; the message names the file."""


@dataclass
class _Analysis:
    """Everything the build derives from a vocabulary (kept for queries and explanations)."""

    enc: tiktoken.Encoding
    tokens: list[bytes | None]
    model: str
    lsig: np.ndarray
    rsig: np.ndarray
    cross: np.ndarray
    within: np.ndarray
    lsigs: list[tuple]
    rsigs: list[tuple]
    split_l: np.ndarray
    split_r: np.ndarray
    kind: np.ndarray
    ext_ptr: np.ndarray
    ext_z: np.ndarray
    ext_r: np.ndarray
    pos: np.ndarray
    endp: np.ndarray
    child_ptr: np.ndarray
    child_ids: np.ndarray
    special: np.ndarray


def analyze(encoding: str | tiktoken.Encoding) -> _Analysis:
    """Vocabulary analysis shared by the build, the reference build and explanations."""
    enc = get_encoding(encoding) if isinstance(encoding, str) else encoding
    V = enc.n_vocab
    tokens = token_bytes_table(enc)
    ranks = mergeable_ranks(enc)
    model = model_for_pattern(split_pattern(enc))
    lsig, rsig, cross, within, lsigs, rsigs = signature_tables(tokens, model)
    # every way of writing a token as token + token: (left, right, merged)
    pl, pr, pz = [], [], []
    for z, b in enumerate(tokens):
        if b is None or len(b) < 2:
            continue
        for k in range(1, len(b)):
            lt = ranks.get(b[:k])
            if lt is not None:
                rt = ranks.get(b[k:])
                if rt is not None:
                    pl.append(lt)
                    pr.append(rt)
                    pz.append(z)
    pl_a = np.asarray(pl, dtype=np.int32)
    pr_a = np.asarray(pr, dtype=np.int32)
    pz_a = np.asarray(pz, dtype=np.int32)
    keys, vals = kb.build_pair_hash(pl_a, pr_a, pz_a, V)
    ids = np.asarray([i for i, b in enumerate(tokens) if b is not None], dtype=np.int64)
    lens = np.asarray([len(tokens[i]) for i in ids], dtype=np.int64)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = np.frombuffer(b"".join(tokens[i] for i in ids), dtype=np.uint8)
    byte_id = np.asarray([ranks[bytes([i])] for i in range(256)], dtype=np.int32)
    split_l, split_r, kind = kb.token_splits(
        data, offsets, ids, byte_id, keys, vals, V, int(lens.max()) + 1
    )
    order = np.lexsort((pz_a, pl_a))
    ext_z = np.ascontiguousarray(pz_a[order])
    ext_r = np.ascontiguousarray(pr_a[order])
    ext_ptr = np.zeros(V + 1, dtype=np.int64)
    np.add.at(ext_ptr, pl_a.astype(np.int64) + 1, 1)
    np.cumsum(ext_ptr, out=ext_ptr)
    pos, endp, child_ptr, child_ids = kb.left_tree_order(split_l, kind)
    special = np.zeros(V, dtype=np.bool_)
    for t in special_tokens(enc).values():
        special[t] = True
    return _Analysis(enc, tokens, model, lsig, rsig, cross, within, lsigs, rsigs, split_l,
                     split_r, kind, ext_ptr, ext_z, ext_r, pos, endp, child_ptr, child_ids,
                     special)


def _signature_bits(an: _Analysis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per left signature, packed rows of regex-boundary next tokens (``cross_bits``) and of
    same-piece candidates that BPE can produce (``cand_bits``); plus the packed mask of next
    tokens whose BPE verdict applies (monotone merges)."""
    V = len(an.tokens)
    cross = an.cross[:, an.rsig] | an.special[None, :]
    cand = an.within[:, an.rsig] & ~cross & (an.kind > 0)[None, :]
    pack = lambda m: np.packbits(m, axis=-1, bitorder="little")  # noqa: E731
    kind1 = pack(an.kind == 1)
    assert cross.shape[1] == V
    return pack(cross), pack(cand), kind1


def _bpe_steps(ranks: dict[bytes, int], piece: bytes):
    """tiktoken's ``byte_pair_merge`` in plain Python (lowest rank first, leftmost on ties),
    without the whole-piece shortcut: yields ``(parts, i, rank)`` before each merge of
    ``parts[i]`` and ``parts[i + 1]``; ``parts`` is the final split once it is exhausted."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, bi = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, bi = r, i
        if bi < 0:
            break
        yield parts, bi, best
        parts[bi : bi + 2] = [parts[bi] + parts[bi + 1]]


def byte_pair_merge(ranks: dict[bytes, int], piece: bytes) -> list[bytes]:
    """tiktoken's ``byte_pair_merge`` in plain Python (lowest rank first, leftmost on ties),
    without the whole-piece shortcut. Returns the parts."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    # the generator merges its list in place after each yield: the last one seen is final
    for parts, _, _ in _bpe_steps(ranks, piece):  # noqa: B007
        pass
    return parts


_LUT64 = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                       bitorder="little").copy().view(np.uint64).reshape(256)


@nb.njit(parallel=True, cache=True)
def _unpack_rows(packed, rows, lut64, out64):
    """out64[i, j] = the 8 bools (as one uint64) of byte j of row rows[i]."""
    for i in nb.prange(len(rows)):
        src = packed[rows[i]]
        dst = out64[i]
        for j in range(len(src)):
            dst[j] = lut64[src[j]]


def unpack_rows_torch(packed, n_vocab: int):
    """Unpack ``torch.uint8[..., row_bytes]`` rows (little bit order: token ``j`` is bit
    ``j % 8`` of byte ``j // 8``) to ``torch.bool[..., n_vocab]`` with torch bit operations
    on the rows' device (the path for accelerators and the trainer's kernels).

    Raises:
        TypeError: rows that are not uint8.
    """
    import torch

    if packed.dtype != torch.uint8:
        raise TypeError(f"mask bits must be uint8, got {packed.dtype}")
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :n_vocab].bool()


class LegalityTable:
    """Bit-packed possible/impossible table over (previous token, next token).

    Attributes:
        identity: the tokenizer identity the table was built for.
        packed: ``uint8[n_rows, row_bytes]`` (a memmap when loaded); bit set = possible.
        rows: ``None`` for a full table, else the previous-token ids of a partial build
            (``packed[k]`` is row ``rows[k]``).
        meta: header fields (build seconds, counts, regex model).
    """

    def __init__(self, ident: TokenizerIdentity, packed: np.ndarray, meta: dict,
                 rows: np.ndarray | None = None) -> None:
        self.identity = ident
        self.packed = packed
        self.meta = meta
        self.rows = rows
        self.n_vocab = ident.n_vocab
        self.row_bytes = (self.n_vocab + 7) // 8
        self._row_index: np.ndarray | None = None  # id -> row of a partial table, or -1
        if rows is not None:
            self._row_index = np.full(self.n_vocab, -1, dtype=np.int64)
            self._row_index[np.asarray(rows, dtype=np.int64)] = np.arange(len(rows))
        self._analysis: _Analysis | None = None

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, encoding: str, rows: np.ndarray | None = None, progress: bool = False,
              chunk_rows: int = 4096) -> LegalityTable:
        """Build the table for encoding ``encoding`` (a tiktoken name).

        Args:
            rows: optional subset of previous-token ids to build (tests); ``None`` = all.
            progress: show a tqdm bar over rows.
            chunk_rows: rows per numba call (progress granularity).

        Returns a table whose ``meta["build_seconds"]`` is the wall time. Uses numba's thread
        count (``NUMBA_NUM_THREADS``) for the parallel row loop.
        """
        t0 = time.perf_counter()
        an = analyze(encoding)
        ident = identity(encoding)
        V = an.enc.n_vocab
        row_ids = np.arange(V, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        row_bytes = (V + 7) // 8
        packed = np.empty((len(row_ids), row_bytes), dtype=np.uint8)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(row_ids), unit="row", desc=f"legality {encoding}")
        n_chunks = max(1, 8 * nb.get_num_threads())
        cross_bits, cand_bits, kind1_bits = _signature_bits(an)
        id_at = np.empty(V, dtype=np.int32)
        id_at[an.pos] = np.arange(V, dtype=np.int32)
        for s in range(0, len(row_ids), chunk_rows):
            sub = row_ids[s : s + chunk_rows]
            packed[s : s + len(sub)] = kb.build_rows(
                sub, an.lsig, cross_bits, cand_bits, kind1_bits, an.split_r, an.kind,
                an.ext_ptr, an.ext_z, an.ext_r, an.pos, an.endp, an.child_ptr, an.child_ids,
                id_at, n_chunks,
            )
            if bar is not None:
                bar.update(len(sub))
        if bar is not None:
            bar.close()
        # special tokens as previous tokens: everything may follow (documents are EOT-separated)
        packed[an.special[row_ids]] = 0xFF
        if V % 8:
            packed[:, -1] &= np.uint8((1 << (V % 8)) - 1)
        seconds = time.perf_counter() - t0
        meta = {
            "model": an.model,
            "build_seconds": round(seconds, 3),
            "threads": nb.get_num_threads(),
            "unused_ids": int(sum(1 for i, b in enumerate(an.tokens)
                                  if b is None and not an.special[i])),
            "unreachable_tokens": int(sum(1 for i, b in enumerate(an.tokens)
                                          if b is not None and an.kind[i] == 0)),
            "non_monotone_tokens": int((an.kind == 2).sum()),
        }
        table = cls(ident, packed, meta, None if rows is None else row_ids)
        table._analysis = an
        if rows is None:
            meta["n_impossible"] = table.n_impossible()
        return table

    # ------------------------------------------------------------------ io
    def save(self, path: str | os.PathLike) -> Path:
        """Write the table atomically to ``path`` (a file, or a folder that gets
        ``<encoding>.legality``). Raises ``ValueError`` for a partial (row-subset) table."""
        if self.rows is not None:
            raise ValueError("only full tables are saved; this one holds a subset of rows")
        p = Path(path)
        if p.is_dir() or p.suffix == "":
            p = p / f"{self.identity.name}.legality"
        header = {
            "format_version": FORMAT_VERSION,
            "identity": self.identity.model_dump(),
            "n_vocab": self.n_vocab,
            "row_bytes": self.row_bytes,
            "bit_order": "little",
            "bit_meaning": BIT_POSSIBLE,
            **self.meta,
        }
        return _write_table(p, header, [self.packed])

    @classmethod
    def load(cls, path: str | os.PathLike, encoding: str | TokenizerIdentity | None = None,
             mmap: bool = True) -> LegalityTable:
        """Open a saved table (memory-mapped by default).

        What a set bit means is read from the file's own header (``bit_meaning``), never
        assumed: a table in tokenmill's polarity is used as it is; one in the speedrun's
        forbidden-pair polarity and padded layout (:func:`export_modded_nanogpt`) is inverted
        and cut to the tokenizer's vocabulary in memory (then ``mmap`` does not apply).

        Args:
            encoding: the tokenizer the caller uses (name or identity); when given, a table
                built for another tokenizer raises :class:`TokenizerMismatchError` naming both.

        Raises:
            LegalityFormatError: bad magic, header, polarity or size (naming the file).
            TokenizerMismatchError: the table belongs to another tokenizer.
        """
        p = _table_file(Path(path), encoding)
        header, ident = _read_header(p)
        if encoding is not None:
            want = identity(encoding) if isinstance(encoding, str) else encoding
            check_same(want, ident, f"legality table {p}")
        meaning = header.get("bit_meaning")
        if meaning not in (BIT_POSSIBLE, BIT_FORBIDDEN):
            raise LegalityFormatError(
                f"{p}: header does not say what a set bit means (bit_meaning={meaning!r}; "
                f"expected {BIT_POSSIBLE!r} or {BIT_FORBIDDEN!r}); refusing to guess")
        V, rb = header["n_vocab"], header["row_bytes"]
        size = os.path.getsize(p)
        if size != DATA_OFFSET + V * rb:
            raise LegalityFormatError(
                f"{p}: {size} bytes, expected {DATA_OFFSET + V * rb} for {V} rows of {rb} bytes"
            )
        if meaning == BIT_POSSIBLE and (V != ident.n_vocab or rb != (V + 7) // 8):
            raise LegalityFormatError(f"{p}: {V} rows of {rb} bytes, expected {ident.n_vocab} "
                                      f"rows of {(ident.n_vocab + 7) // 8} for {ident.short()}")
        if meaning == BIT_FORBIDDEN and (V < ident.n_vocab or rb * 8 < V):
            raise LegalityFormatError(f"{p}: {V} rows of {rb} bytes cannot hold the "
                                      f"{ident.n_vocab} tokens of {ident.short()}")
        meta = {k: v for k, v in header.items()
                if k not in ("identity", "n_vocab", "row_bytes", "bit_order", "bit_meaning",
                             "format_version", "layout", "tokenizer_n_vocab")}
        if meaning == BIT_FORBIDDEN:
            meta["loaded_from"] = "forbidden-pair polarity (modded-nanogpt layout), inverted"
            return cls(ident, _possible_from_forbidden(p, V, rb, ident.n_vocab), meta)
        if mmap:
            packed = np.memmap(p, dtype=np.uint8, mode="r", offset=DATA_OFFSET, shape=(V, rb))
        else:
            with open(p, "rb") as f:
                f.seek(DATA_OFFSET)
                packed = np.frombuffer(f.read(), dtype=np.uint8).reshape(V, rb)
        return cls(ident, packed, meta)

    # ------------------------------------------------------------------ queries
    def _row(self, a: int) -> int:
        if not 0 <= a < self.n_vocab:
            raise IndexError(f"token id {a} outside vocabulary of {self.identity.name} "
                             f"({self.n_vocab})")
        if self._row_index is None:
            return a
        k = int(self._row_index[a])
        if k < 0:
            raise KeyError(f"row {a} was not built in this partial table")
        return k

    def _rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`_row` (raises like it)."""
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise IndexError(f"previous-token id outside vocabulary of {self.identity.name}")
        if self._row_index is None:
            return ids
        k = self._row_index[ids]
        if len(k) and k.min() < 0:
            raise KeyError(f"row {int(ids[np.argmin(k)])} was not built in this partial table")
        return k

    def is_possible(self, a: int, b: int) -> bool:
        """True if token ``b`` can follow token ``a`` in some canonical encoding."""
        if not 0 <= b < self.n_vocab:
            raise IndexError(f"token id {b} outside vocabulary of {self.identity.name}")
        return bool(self.packed[self._row(a), b >> 3] >> (b & 7) & 1)

    def allowed_next(self, a: int) -> np.ndarray:
        """``bool[n_vocab]``: which next tokens are possible after ``a``."""
        row = np.asarray(self.packed[self._row(a)])
        return np.unpackbits(row, bitorder="little", count=self.n_vocab).astype(np.bool_)

    def possible_pairs(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """Vectorised lookup: ``bool[N]`` for pairs ``(prev[i], nxt[i])`` (full tables, or
        partial tables holding every ``prev``)."""
        prev = np.asarray(prev, dtype=np.int64)
        nxt = np.asarray(nxt, dtype=np.int64)
        rows = self._rows_of(prev)
        byte = np.asarray(self.packed[rows, nxt >> 3])
        return ((byte >> (nxt & 7).astype(np.uint8)) & 1).astype(np.bool_)

    def packed_rows(self, prev_ids) -> np.ndarray:
        """``uint8[N, row_bytes]`` packed rows for kernels that unpack bits themselves
        (bit ``j & 7`` of byte ``j >> 3`` = next token ``j`` possible)."""
        idx = self._rows_of(np.asarray(prev_ids, dtype=np.int64).reshape(-1))
        return np.asarray(self.packed[idx])

    def mask_rows(self, prev_ids, device=None):
        """``torch.BoolTensor[N, n_vocab]``: allowed next tokens for each previous token.

        Args:
            prev_ids: ``torch.LongTensor[N]`` (or any int array) of previous-token ids.
            device: target device; on CPU the rows are gathered and unpacked by a parallel
                numba kernel straight into the tensor's memory (a view of an
                ``[N, row_bytes * 8]`` buffer, about N * n_vocab bytes); on another device the
                packed rows are uploaded and unpacked with torch bit operations.
        """
        import torch

        if isinstance(prev_ids, torch.Tensor):
            dev = torch.device(device) if device is not None else prev_ids.device
            ids = prev_ids.detach().to("cpu", torch.int64).numpy().reshape(-1)
        else:
            dev = torch.device(device or "cpu")
            ids = np.asarray(prev_ids, dtype=np.int64).reshape(-1)
        ids = self._rows_of(ids)
        if dev.type == "cpu":
            # one uint64 store per packed byte; rows are padded to row_bytes * 8 and the
            # returned tensor is the [:, :n_vocab] view (row stride row_bytes * 8)
            out = torch.empty((len(ids), self.row_bytes * 8), dtype=torch.bool)
            out64 = out.numpy().view(np.uint8).view(np.uint64)
            _unpack_rows(self.packed, ids, _LUT64, out64)
            return out[:, : self.n_vocab]
        packed = torch.from_numpy(np.asarray(self.packed[ids])).to(dev)
        return unpack_rows_torch(packed, self.n_vocab)

    def impossible_per_row(self) -> np.ndarray:
        """``int64[n_rows]``: impossible next tokens per previous token."""
        return self.n_vocab - kb.popcount_rows(np.asarray(self.packed))

    def n_impossible(self) -> int:
        """Total impossible pairs of the (full or partial) table."""
        return int(self.impossible_per_row().sum())

    # ------------------------------------------------------------------ explanations
    def analysis(self) -> _Analysis:
        if self._analysis is None:
            self._analysis = analyze(self.identity.name)
        return self._analysis

    def explain(self, a: int, b: int) -> str:
        """Why ``(a, b)`` is possible or impossible: the regex rule at the junction and,
        inside one piece, the BPE merge that crosses the junction (or the merge result that
        keeps the two tokens apart)."""
        return explain_pair(self.analysis(), a, b, self.is_possible(a, b))


def _table_file(p: Path, encoding: str | TokenizerIdentity | None) -> Path:
    """``p`` itself, or the ``*.legality`` file in folder ``p`` (``<encoding>.legality`` first)."""
    if not p.is_dir():
        return p
    cands = sorted(p.glob("*.legality"))
    if isinstance(encoding, str):
        cands = [c for c in cands if c.stem == encoding] or cands
    if not cands:
        raise FileNotFoundError(f"no *.legality file in {p}")
    return cands[0]


def _read_header(p: Path) -> tuple[dict, TokenizerIdentity]:
    """The JSON header of table file ``p`` and its tokenizer identity.

    Raises:
        LegalityFormatError: not a tokenmill table file, or an unreadable header.
    """
    with open(p, "rb") as f:
        head = f.read(DATA_OFFSET)
    if head[:8] != MAGIC:
        raise LegalityFormatError(
            f"{p}: not a legality table (magic {head[:8]!r}, expected {MAGIC!r}); a bare "
            "mask array does not say what its bits mean, so it is not read")
    (n,) = struct.unpack("<I", head[8:12])
    try:
        header = json.loads(head[12 : 12 + n])
        ident = TokenizerIdentity(**header["identity"])
        int(header["n_vocab"]), int(header["row_bytes"])
    except Exception as e:
        raise LegalityFormatError(f"{p}: unreadable header ({e})") from e
    return header, ident


def _write_table(p: Path, header: dict, blocks) -> Path:
    """Write magic, ``header`` and the uint8 row ``blocks`` (in order) atomically to ``p``."""
    blob = json.dumps(header, sort_keys=True).encode()
    if len(blob) + 12 > DATA_OFFSET:
        raise ValueError("legality header too large")
    head = MAGIC + struct.pack("<I", len(blob)) + blob
    head += b"\0" * (DATA_OFFSET - len(head))
    with atomic_open(p) as f:
        f.write(head)
        for block in blocks:
            f.write(np.ascontiguousarray(block).data)
    return p


def _possible_from_forbidden(p: Path, V: int, rb: int, n_vocab: int) -> np.ndarray:
    """Rows ``[:n_vocab]`` of a forbidden-polarity matrix (``V`` rows of ``rb`` bytes at
    :data:`DATA_OFFSET` of ``p``) in tokenmill's polarity: ``uint8[n_vocab, ceil(n_vocab/8)]``,
    bits past ``n_vocab`` zero."""
    data = np.memmap(p, dtype=np.uint8, mode="r", offset=DATA_OFFSET, shape=(V, rb))
    out = np.invert(np.asarray(data[:n_vocab, : (n_vocab + 7) // 8]))
    if n_vocab % 8:
        out[:, -1] &= np.uint8((1 << (n_vocab % 8)) - 1)
    return out


def export_modded_nanogpt(table: LegalityTable, path: str | os.PathLike,
                          vocab_size: int | None = None, block_rows: int = 4096) -> Path:
    """Write ``table`` as the speedrun's validation mask: polarity and layout of
    modded-nanogpt's ``GPT.canon_mask`` (``build_canonical_mask`` in its ``train_gpt.py``).

    The matrix is ``uint8[vocab_size, vocab_size // 8]``, row = previous token, bit ``x & 7`` of
    byte ``x >> 3`` set when token ``x`` never follows (a *forbidden* pair); rows and columns
    of padding ids (``>= n_vocab``) are 0 (never masked, as the speedrun's all-zero default).
    It follows tokenmill's 4096-byte header, whose ``bit_meaning`` and ``layout`` say so, so
    the speedrun side reads it with
    ``np.fromfile(path, np.uint8, offset=4096).reshape(vocab_size, vocab_size // 8)`` and
    :meth:`LegalityTable.load` reads it back in tokenmill's polarity.

    Args:
        table: a full table (not a row subset).
        path: output file.
        vocab_size: the model's padded vocabulary; default the next multiple of 128 (the
            speedrun's ``next_multiple_of_n(vocab_size, n=128)``: 50,304 for GPT-2).
        block_rows: rows converted per write (bounds memory to ``block_rows * vocab_size / 8``).

    Raises:
        ValueError: a partial table, or a ``vocab_size`` below the tokenizer's or not a
            multiple of 8.
    """
    if table.rows is not None:
        raise ValueError("only full tables are exported; this one holds a subset of rows")
    V, rb = table.n_vocab, table.row_bytes
    Vp = vocab_size if vocab_size is not None else -(-V // 128) * 128
    if Vp < V or Vp % 8:
        raise ValueError(f"vocab_size {Vp}: expected a multiple of 8 that is at least the "
                         f"{V} ids of {table.identity.name}")
    header = {
        "format_version": FORMAT_VERSION,
        "identity": table.identity.model_dump(),
        "n_vocab": Vp,
        "row_bytes": Vp // 8,
        "tokenizer_n_vocab": V,
        "bit_order": "little",
        "bit_meaning": BIT_FORBIDDEN,
        "layout": MODDED_NANOGPT_LAYOUT,
        **{k: v for k, v in table.meta.items() if k != "loaded_from"},
    }
    last = np.uint8((1 << (V % 8)) - 1) if V % 8 else np.uint8(0xFF)

    def blocks():
        for s in range(0, Vp, block_rows):
            e = min(s + block_rows, Vp)
            block = np.zeros((e - s, Vp // 8), dtype=np.uint8)
            k = max(0, min(e, V) - s)
            if k:
                block[:k, :rb] = np.invert(np.asarray(table.packed[s : s + k]))
                block[:k, rb - 1] &= last
            yield block

    return _write_table(Path(path), header, blocks())


def pair_possible(an: _Analysis, a: int, b: int) -> bool:
    """The table's definition for one pair, computed directly in Python (no table)."""
    if an.special[a] or an.special[b]:
        return True
    ba, bb = an.tokens[a], an.tokens[b]
    if ba is None or bb is None:
        return False
    cross, within, _ = pair_rule(an.lsigs[an.lsig[a]], an.rsigs[an.rsig[b]], an.model)
    if cross:
        return True
    if not within:
        return False
    if an.kind[a] == 2 or an.kind[b] == 2:
        return an.kind[a] > 0 and an.kind[b] > 0
    return byte_pair_merge(mergeable_ranks(an.enc), ba + bb) == [ba, bb]


def explain_pair(an: _Analysis, a: int, b: int, possible: bool | None = None) -> str:
    """Human-readable verdict and reason for pair ``(a, b)`` (see :meth:`LegalityTable.explain`);
    ``possible`` defaults to :func:`pair_possible`."""
    if possible is None:
        possible = pair_possible(an, a, b)
    verdict = "possible" if possible else "impossible"
    head = f"{_show(an, a)} -> {_show(an, b)}: {verdict}"
    if an.special[a] or an.special[b]:
        return head + " (special tokens sit between documents; allowed by convention)"
    if an.tokens[a] is None or an.tokens[b] is None:
        return head + " (unused token id: never produced)"
    cross, within, why = pair_rule(an.lsigs[an.lsig[a]], an.rsigs[an.rsig[b]], an.model)
    if cross:
        return head + f"\n  regex: {why}, so {_show(an, a)} can end one piece and " \
                      f"{_show(an, b)} start the next"
    lines = [head, f"  regex: {why}"]
    if not within:
        return "\n".join(lines)
    ranks = mergeable_ranks(an.enc)
    ba, bb = an.tokens[a], an.tokens[b]
    if an.kind[a] == 2 or an.kind[b] == 2:
        lines.append("  BPE: a token's own merges are not in rank order; kept as possible "
                     "(conservative)")
        return "\n".join(lines)
    for tok, bt in ((a, ba), (b, bb)):
        if an.kind[tok] == 0:
            parts = byte_pair_merge(ranks, bt)
            lines.append(f"  BPE: {_show(an, tok)} is never produced by merging its own "
                         f"bytes ({_fmt(parts)}); it only appears as a whole piece")
            return "\n".join(lines)
    trace = _merge_trace(ranks, ba + bb, len(ba))
    if trace is None:
        lines.append(f"  BPE: byte_pair_merge({_fmt([ba + bb])}) = {_fmt([ba, bb])}: no "
                     "merge across the junction ever wins, so both survive inside one piece")
    else:
        (lft, rgt, rank), parts = trace
        lines.append(
            f"  BPE: inside one piece the merge {_fmt([lft])} + {_fmt([rgt])} -> "
            f"{_fmt([lft + rgt])} (rank {rank}) crosses the junction before "
            f"{_show(an, a)} / {_show(an, b)} are complete; "
            f"{_fmt([ba + bb])} encodes as {_fmt(parts)}"
        )
    return "\n".join(lines)


def _merge_trace(ranks: dict[bytes, int], piece: bytes, cut: int):
    """First merge that crosses byte offset ``cut`` in byte_pair_merge(piece), with the final
    parts; None if no merge crosses it."""
    first = None
    parts = [piece[i : i + 1] for i in range(len(piece))]
    for parts, bi, rank in _bpe_steps(ranks, piece):  # noqa: B007 - merged in place
        start = sum(len(p) for p in parts[:bi])
        if first is None and start < cut < start + len(parts[bi]) + len(parts[bi + 1]):
            first = (parts[bi], parts[bi + 1], rank)
    return None if first is None else (first, parts)


def _fmt(parts: list[bytes]) -> str:
    return "|".join(repr(p.decode("utf-8", "backslashreplace"))[1:-1] for p in parts)


def _show(an: _Analysis, t: int) -> str:
    b = an.tokens[t]
    if b is None:
        for name, i in special_tokens(an.enc).items():
            if i == t:
                return f"{name}({t})"
        return f"<unused>({t})"
    return f"{b.decode('utf-8', 'backslashreplace')!r}({t})"


def reference_row(an: _Analysis, a: int) -> np.ndarray:
    """Plain-Python build of row ``a`` from the same definition (regex rules per signature
    pair, BPE by running ``byte_pair_merge`` on every concatenation): ``bool[n_vocab]``.
    The independent check of the numba build and the benchmark's peer."""
    V = len(an.tokens)
    out = np.zeros(V, dtype=np.bool_)
    if an.special[a]:
        out[:] = True
        return out
    ranks = mergeable_ranks(an.enc)
    ba = an.tokens[a]
    cache: dict[int, tuple[bool, bool]] = {}
    A = an.lsigs[an.lsig[a]]
    for b in range(V):
        if an.special[b]:
            out[b] = True
            continue
        bb = an.tokens[b]
        if ba is None or bb is None:
            continue
        rs = int(an.rsig[b])
        cw = cache.get(rs)
        if cw is None:
            c, w, _ = pair_rule(A, an.rsigs[rs], an.model)
            cw = cache[rs] = (c, w)
        if cw[0]:
            out[b] = True
        elif cw[1]:
            if an.kind[a] == 2 or an.kind[b] == 2:
                out[b] = an.kind[a] > 0 and an.kind[b] > 0
            else:
                out[b] = byte_pair_merge(ranks, ba + bb) == [ba, bb]
    return out


def resolve_token(enc: tiktoken.Encoding, text: str) -> int:
    """A token given as an id (``"1234"``), a Python-escaped literal (``"' bananas'"``,
    ``"'\\n'"``) or plain text that encodes to exactly one token.

    Raises:
        ValueError: the text is not exactly one token, naming its encoding.
    """
    s = text
    if s.lstrip("-").isdigit():
        t = int(s)
        if not 0 <= t < enc.n_vocab:
            raise ValueError(f"token id {t} outside {enc.name} vocabulary ({enc.n_vocab})")
        return t
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        import ast

        try:
            s = ast.literal_eval(s)
        except (SyntaxError, ValueError):
            s = text  # not a Python literal: take the text as it is
    if isinstance(s, bytes):
        t = mergeable_ranks(enc).get(s)
        if t is None:
            raise ValueError(f"{s!r} is not a token of {enc.name}")
        return t
    if s in special_tokens(enc):
        return special_tokens(enc)[s]
    t = mergeable_ranks(enc).get(s.encode("utf-8"))
    if t is not None:
        return t
    ids = enc.encode_ordinary(s)
    raise ValueError(f"{s!r} is not one {enc.name} token (it encodes as {ids})")
