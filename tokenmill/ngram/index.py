"""Offline suffix-array index over a datamix's shards (infini-gram style).

The technique is infini-gram's (Liu et al., 2024, "Infini-gram: Scaling Unbounded n-gram
Language Models to a Trillion Tokens", https://github.com/liujch1998/infini-gram): a
suffix array over the token stream answers the count of any n-gram with two binary
searches, and the ∞-gram's "longest suffix of the context that occurs in the corpus"
with a binary search on the suffix length.

On disk (one folder)::

    meta.json      format, tokenizer identity, token dtype, sentinel, one entry per part
    tokens.bin     every part's tokens, little-endian uint16 (or uint32), concatenated;
                   a part is consecutive shards' tokens followed by one sentinel token
    sa.bin         the suffix array of each part, as *global* positions into tokens.bin
                   (uint32 while the index holds < 2**32 tokens, else uint64), part by part
    docs.parquet   one row per document: global start position (its EOT) and key

Bytes per token on disk: 2 (uint16 tokens) + 4 (uint32 suffix array) = 6 for gpt2-size
vocabularies and indices below 4.29 G tokens (+ ~0.02 for the document table).

Shards are read one at a time and grouped into parts of at most ``max_part_tokens``
(default 256 M); each part's suffix array is built with ``pydivsufsort`` (libdivsufsort,
integer alphabets) and the parts are queried together: counts add up over parts.

Document boundaries: every document starts with the EOT token, and a part ends with the
sentinel (the dtype's maximum value, never a token id). An n-gram may contain EOT only as
its first token (a match at a document start); one with EOT anywhere else would span two
documents and has count 0. The token following a match at the end of a document is the
next document's EOT ("the document ends"), also across shards (every shard starts
with EOT); the sentinel that ends a part is reported as EOT too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.atomic import atomic_open, atomic_write_text
from tokenmill.manifests.shards import read_sidecar, read_tokens
from tokenmill.manifests.verify import open_shards
from tokenmill.suffixarray import integer_suffix_array
from tokenmill.tokenizers import TokenizerIdentity

FORMAT = "tokenmill-sa-index/1"


class IndexError_(ValueError):
    """A malformed index folder or an invalid query (the message names the file/token)."""


# --------------------------------------------------------------------------- numba core


@nb.njit(cache=True, inline="always")
def _cmp(tokens, pos, q, q0, qlen):
    """Compare the suffix at ``pos`` with ``q[q0:q0+qlen]``: -1 (suffix < q), 0 (q is a
    prefix of the suffix), 1 (suffix > q). The part's sentinel (max value) stops it."""
    for k in range(qlen):
        a = np.int64(tokens[pos + k])
        b = q[q0 + k]
        if a < b:
            return -1
        if a > b:
            return 1
    return 0


@nb.njit(cache=True)
def _range(tokens, sa, lo, hi, q, q0, qlen):
    """SA range [a, b) within sa[lo:hi] of suffixes starting with q[q0:q0+qlen]."""
    a, b = lo, hi
    while a < b:  # lower bound: first suffix >= q
        mid = (a + b) >> 1
        if _cmp(tokens, np.int64(sa[mid]), q, q0, qlen) < 0:
            a = mid + 1
        else:
            b = mid
    first = a
    b = hi
    while a < b:  # upper bound: first suffix > q (q not a prefix)
        mid = (a + b) >> 1
        if _cmp(tokens, np.int64(sa[mid]), q, q0, qlen) <= 0:
            a = mid + 1
        else:
            b = mid
    return first, a


@nb.njit(cache=True)
def _exists(tokens, sa, lo, hi, q, q0, qlen):
    """Whether some suffix in sa[lo:hi] starts with q[q0:q0+qlen] (one binary search)."""
    a, b = lo, hi
    while a < b:
        mid = (a + b) >> 1
        if _cmp(tokens, np.int64(sa[mid]), q, q0, qlen) < 0:
            a = mid + 1
        else:
            b = mid
    return a < hi and _cmp(tokens, np.int64(sa[a]), q, q0, qlen) == 0


@nb.njit(cache=True)
def _count_one(tokens, sa, parts, q, q0, qlen, eot):
    for k in range(1, qlen):
        if q[q0 + k] == eot:
            return np.int64(0)
    total = np.int64(0)
    for p in range(parts.size - 1):
        a, b = _range(tokens, sa, parts[p], parts[p + 1], q, q0, qlen)
        total += b - a
    return total


@nb.njit(cache=True)
def _count_single(tokens, sa, parts, q, eot, n_vocab):
    """count of q with the vocabulary check inside (-1 - i: token q[i] is invalid)."""
    for i in range(q.size):
        if q[i] < 0 or q[i] >= n_vocab:
            return -1 - i
    if q.size == 0:
        return np.int64(sa.size - (parts.size - 1))
    return _count_one(tokens, sa, parts, q, 0, q.size, eot)


@nb.njit(cache=True, parallel=True)
def _count_batch(tokens, sa, parts, flat, offs, eot):
    n = offs.size - 1
    out = np.empty(n, np.int64)
    for i in nb.prange(n):
        out[i] = _count_one(tokens, sa, parts, flat, offs[i], offs[i + 1] - offs[i], eot)
    return out


@nb.njit(cache=True)
def _groups(tokens, sa, a, b, L, sentinel, eot, out_tok, out_cnt, n_out):
    """Append (next token, count) groups of SA range [a, b) (suffixes sharing their first
    L tokens, so sorted by the token at offset L) to out_*; returns the new n_out."""
    i = a
    while i < b:
        t = np.int64(tokens[np.int64(sa[i]) + L])
        lo = i + 1  # tokens at offset L are sorted: gallop to bracket the group's end
        step = 1
        while lo + step - 1 < b and np.int64(tokens[np.int64(sa[lo + step - 1]) + L]) == t:
            lo += step
            step *= 2
        hi = min(lo + step - 1, b)
        while lo < hi:  # first index in [lo, hi) whose next token is > t
            mid = (lo + hi) >> 1
            if np.int64(tokens[np.int64(sa[mid]) + L]) <= t:
                lo = mid + 1
            else:
                hi = mid
        out_tok[n_out] = eot if t == sentinel else t
        out_cnt[n_out] = lo - i
        n_out += 1
        i = lo
    return n_out


@nb.njit(cache=True)
def _next_dist(tokens, sa, parts, q, q0, qlen, eot, sentinel, n_vocab):
    """Full next-token distribution of context q[q0:q0+qlen] as sorted (tokens, counts)."""
    cap = 64
    tok = np.empty(cap, np.int64)
    cnt = np.empty(cap, np.int64)
    n = 0
    bad = False
    for k in range(1, qlen):
        if q[q0 + k] == eot:
            bad = True
    if not bad:
        for p in range(parts.size - 1):
            a, b = _range(tokens, sa, parts[p], parts[p + 1], q, q0, qlen)
            if b - a == 0:
                continue
            need = n + min(b - a, n_vocab + 1)
            if need > cap:
                while cap < need:
                    cap *= 2
                t2 = np.empty(cap, np.int64)
                c2 = np.empty(cap, np.int64)
                t2[:n] = tok[:n]
                c2[:n] = cnt[:n]
                tok, cnt = t2, c2
            if qlen == 0:  # the sentinel itself starts a suffix with no next token
                b -= 1
            n = _groups(tokens, sa, a, b, qlen, sentinel, eot, tok, cnt, n)
    # merge equal tokens (across parts, and the sentinel mapped to EOT)
    order = np.argsort(tok[:n], kind="mergesort")
    rt = np.empty(n, np.int64)
    rc = np.empty(n, np.int64)
    m = 0
    for j in range(n):
        t = tok[order[j]]
        if m > 0 and rt[m - 1] == t:
            rc[m - 1] += cnt[order[j]]
        else:
            rt[m] = t
            rc[m] = cnt[order[j]]
            m += 1
    return rt[:m], rc[:m]


@nb.njit(cache=True)
def _topk(rt, rc, k, out_t, out_c):
    """Top-k of (tokens, counts) by count desc, then token asc; pads with -1 / 0."""
    order = np.argsort(-rc, kind="mergesort")  # stable: ties keep ascending token order
    for j in range(k):
        if j < order.size:
            out_t[j] = rt[order[j]]
            out_c[j] = rc[order[j]]
        else:
            out_t[j] = -1
            out_c[j] = 0


@nb.njit(cache=True, parallel=True)
def _next_topk_batch(tokens, sa, parts, flat, offs, eot, sentinel, n_vocab, k):
    n = offs.size - 1
    out_t = np.empty((n, k), np.int64)
    out_c = np.empty((n, k), np.int64)
    for i in nb.prange(n):
        rt, rc = _next_dist(tokens, sa, parts, flat, offs[i], offs[i + 1] - offs[i], eot,
                            sentinel, n_vocab)
        _topk(rt, rc, k, out_t[i], out_c[i])
    return out_t, out_c


@nb.njit(cache=True)
def _longest_one(tokens, sa, parts, q, q0, qlen, eot, max_len):
    """(length, count) of the longest suffix of q[q0:q0+qlen] occurring in the index,
    containing EOT at most as its first token; length 0 → count = all tokens."""
    start = q0
    for k in range(qlen - 1, -1, -1):
        if q[q0 + k] == eot:
            start = q0 + k
            break
    end = q0 + qlen
    hi = end - start  # candidate lengths 1..hi
    if max_len > 0 and hi > max_len:
        hi = max_len
    lo = 0
    while lo < hi:  # largest L in [0, hi] that occurs (occurrence is monotone in L)
        mid = (lo + hi + 1) >> 1
        found = False
        for p in range(parts.size - 1):
            if _exists(tokens, sa, parts[p], parts[p + 1], q, end - mid, mid):
                found = True
                break
        if found:
            lo = mid
        else:
            hi = mid - 1
    best_cnt = np.int64(0)
    for p in range(parts.size - 1):
        if lo == 0:
            best_cnt += parts[p + 1] - parts[p] - 1
        else:
            a, b = _range(tokens, sa, parts[p], parts[p + 1], q, end - lo, lo)
            best_cnt += b - a
    return lo, best_cnt


@nb.njit(cache=True)
def _longest_single(tokens, sa, parts, q, eot, sentinel, n_vocab, k, max_len):
    """Serial (no thread-pool wake-up) single ∞-gram query; returns like _longest_batch."""
    out_t = np.full(k, -1, np.int64)
    out_c = np.zeros(k, np.int64)
    L, c = _longest_one(tokens, sa, parts, q, 0, q.size, eot, max_len)
    if k > 0:
        rt, rc = _next_dist(tokens, sa, parts, q, q.size - L, L, eot, sentinel, n_vocab)
        _topk(rt, rc, k, out_t, out_c)
    return L, c, out_t, out_c


@nb.njit(cache=True, parallel=True)
def _longest_batch(tokens, sa, parts, flat, offs, eot, sentinel, n_vocab, k, max_len):
    n = offs.size - 1
    lens = np.empty(n, np.int64)
    cnts = np.empty(n, np.int64)
    out_t = np.empty((n, k), np.int64)
    out_c = np.empty((n, k), np.int64)
    for i in nb.prange(n):
        L, c = _longest_one(tokens, sa, parts, flat, offs[i], offs[i + 1] - offs[i], eot,
                            max_len)
        lens[i] = L
        cnts[i] = c
        if k > 0:
            rt, rc = _next_dist(tokens, sa, parts, flat, offs[i + 1] - L, L, eot, sentinel,
                                n_vocab)
            _topk(rt, rc, k, out_t[i], out_c[i])
    return lens, cnts, out_t, out_c


@nb.njit(cache=True)
def _positions(tokens, sa, parts, q, q0, qlen, eot):
    """All global start positions of q (sorted ascending)."""
    for k in range(1, qlen):
        if q[q0 + k] == eot:
            return np.empty(0, np.int64)
    total = 0
    ranges = np.empty((parts.size - 1, 2), np.int64)
    for p in range(parts.size - 1):
        a, b = _range(tokens, sa, parts[p], parts[p + 1], q, q0, qlen)
        ranges[p, 0] = a
        ranges[p, 1] = b
        total += b - a
    out = np.empty(total, np.int64)
    j = 0
    for p in range(parts.size - 1):
        for i in range(ranges[p, 0], ranges[p, 1]):
            out[j] = sa[i]
            j += 1
    out.sort()
    return out


@nb.njit(cache=True)
def _sa_out_of_range(sa, parts):
    """Index of the first suffix-array entry outside its part's range, or -1."""
    if parts[0] != 0 or parts[-1] != sa.size:
        return 0
    for p in range(parts.size - 1):
        a, b = parts[p], parts[p + 1]
        if b < a:
            return 0
        for i in range(a, b):
            v = np.int64(sa[i])
            if v < a or v >= b:
                return i
    return -1


# --------------------------------------------------------------------------- build


def _sa_dtype(n_total: int) -> type:
    return np.uint32 if n_total < 2**32 else np.uint64


def build_index(
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    split: str | None = "train",
    progress: bool = True,
    max_part_tokens: int = 1 << 28,
    workers: int = 2,
    verify: bool = True,
) -> dict:
    """Build a suffix-array index over a manifest's shards.

    The shards are opened through :func:`tokenmill.manifests.verify.open_shards` (manifest
    complete, every shard present with the recorded size and, with ``verify``, sha256),
    then read one at a time, in manifest order; consecutive shards are grouped into parts of
    at most ``max_part_tokens`` tokens (a shard larger than that is a part of its own); each
    part gets one suffix array (libdivsufsort), so a query does one binary search per part.
    Build memory is about 14 bytes per token of each part being built (``workers`` at once).

    Args:
        manifest_path: ``manifest.json`` (or its folder) of a curation output.
        out_dir: index folder (created; files written atomically).
        split: ``"train"``, ``"val"`` or ``None`` (all shards).
        progress: show a tqdm bar over shards.
        max_part_tokens: part size bound (``< 2**31``, libdivsufsort's int32 limit).
        workers: parts whose suffix arrays are built at once (threads; memory grows by
            ~ 14 bytes per token of each part in flight). The output does not depend on it.
        verify: check every shard's sha256 against the manifest (``False``: sizes only).

    Returns:
        summary dict: ``tokens`` (indexed, one sentinel per part included), ``parts``,
        ``shards``, ``seconds``, ``bytes`` (on disk) and ``bytes_per_token``.

    Raises:
        ShardVerifyError: the manifest is missing or incomplete, or a shard is missing,
            truncated or differs from its sha256 (naming the first such file).
        IndexError_: bad options, no shard of ``split``, or a token id outside the
            vocabulary.
    """
    if not isinstance(workers, (int, np.integer)) or workers < 1:
        raise IndexError_(f"workers must be an integer >= 1, not {workers!r}")
    if not isinstance(max_part_tokens, (int, np.integer)) or not (
            0 < max_part_tokens < 2**31 - 1):
        raise IndexError_(f"max_part_tokens must be in (0, 2**31 - 1), not {max_part_tokens}")
    t0 = time.perf_counter()
    opened = open_shards(manifest_path, split, verify=verify)
    if not opened.shards:
        raise IndexError_(f"{opened.manifest_path}: no shards with split={split!r}")
    out = Path(out_dir)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        s = _build_index(opened, out, progress, max_part_tokens, workers)
    except BaseException:
        # nothing is lost: the files are written atomically, so a failed build leaves an
        # earlier index intact; only a folder this call created (and left empty) goes
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    s["seconds"] = time.perf_counter() - t0
    return s


def _plan_parts(shards: list, max_part_tokens: int) -> list[list]:
    """Consecutive shards grouped into parts of at most ``max_part_tokens`` (+1 sentinel)."""
    groups: list[list] = [[]]
    size = 0
    for s in shards:
        if groups[-1] and size + s.entry.tokens + 1 > max_part_tokens:
            groups.append([])
            size = 0
        groups[-1].append(s)
        size += s.entry.tokens
    return groups


class _PartSorter:
    """Suffix arrays of parts sorted on ``workers`` threads (libdivsufsort releases the GIL)
    and written to ``sa.bin`` in part order, so the file does not depend on ``workers``."""

    def __init__(self, fs, workers: int, sa_dtype: np.dtype):
        self.fs, self.workers, self.sa_dtype = fs, workers, sa_dtype
        self.pool = ThreadPoolExecutor(workers)
        self.pending: list = []

    def submit(self, part: np.ndarray, start: int) -> None:
        self.pending.append((self.pool.submit(integer_suffix_array, part), start))
        self.flush(keep=self.workers - 1)

    def flush(self, keep: int = 0) -> None:
        while len(self.pending) > keep:
            fut, pstart = self.pending.pop(0)
            sa = fut.result()
            if sa.dtype == np.int32 and self.sa_dtype == np.dtype("<u4"):
                u = sa.view(np.uint32)  # >= 0, and start + n < 2**32: shift in place
                if pstart:
                    u += np.uint32(pstart)
                self.fs.write(u.astype("<u4", copy=False).tobytes())
            else:
                for c in range(0, sa.size, 1 << 24):  # global positions, in bounded chunks
                    self.fs.write((sa[c:c + (1 << 24)].astype(np.int64) + pstart).astype(
                        self.sa_dtype).tobytes())
            del sa

    def close(self) -> None:
        self.flush(keep=0)
        self.pool.shutdown()


def _read_part(group: list, dtype, sentinel: int, tok: TokenizerIdentity, start: int,
               docs: tuple[list, list], shards_meta: list, bar) -> np.ndarray:
    """One part's tokens (its shards' tokens, then the sentinel); appends each shard's
    documents (global start, key) to ``docs`` and its entry to ``shards_meta``."""
    part = np.empty(sum(s.entry.tokens for s in group) + 1, dtype=dtype)
    off = 0
    for s in group:
        toks = read_tokens(s.path)
        if toks.size and int(toks.max()) >= tok.n_vocab:
            j = int(np.argmax(np.asarray(toks) >= tok.n_vocab))
            raise IndexError_(f"{s.path}: token id {int(toks[j])} at offset {j} is "
                              f"outside the vocabulary of {tok.short()}")
        part[off:off + toks.size] = toks
        side = read_sidecar(s.path)
        docs[0].append(side.column("offset").to_numpy().astype(np.int64) + start + off)
        docs[1].extend(side.column("key").to_pylist())
        shards_meta.append({"shard": s.entry.path, "split": s.entry.split,
                            "sha256": s.entry.sha256, "start": start + off,
                            "tokens": int(toks.size)})
        off += toks.size
        bar.update(1)
    part[-1] = sentinel
    return part


def _build_index(opened, out: Path, progress: bool, max_part_tokens: int,
                 workers: int) -> dict:
    from tqdm import tqdm

    tok = opened.manifest.tokenizer
    dtype = np.uint16 if tok.n_vocab < 2**16 - 1 else np.uint32
    sentinel = int(np.iinfo(dtype).max)
    groups = _plan_parts(opened.shards, max_part_tokens)
    n_total = sum(s.entry.tokens for s in opened.shards) + len(groups)
    sa_dtype = np.dtype(_sa_dtype(n_total)).newbyteorder("<")
    parts_meta, shards_meta = [], []
    docs: tuple[list, list] = ([], [])
    start = 0
    bar = tqdm(total=len(opened.shards), desc="index shards", disable=not progress)
    with atomic_open(out / "tokens.bin") as ft, atomic_open(out / "sa.bin") as fs:
        sorter = _PartSorter(fs, max(1, min(workers, len(groups))), sa_dtype)
        try:
            for group in groups:
                part = _read_part(group, dtype, sentinel, tok, start, docs, shards_meta, bar)
                sorter.submit(part, start)
                # the tokens are written while the suffix array is sorted
                ft.write(part.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes())
                parts_meta.append({"start": start, "tokens": int(part.size),
                                   "shards": [s.entry.path for s in group]})
                start += part.size
                del part
        finally:
            sorter.close()
    bar.close()
    table = pa.table({"pos": pa.array(np.concatenate(docs[0]), pa.int64()),
                      "key": pa.array(docs[1], pa.string())})
    with atomic_open(out / "docs.parquet") as f:
        pq.write_table(table, f, compression="zstd")
    nbytes = sum((out / n).stat().st_size for n in ("tokens.bin", "sa.bin", "docs.parquet"))
    meta = {
        "format": FORMAT, "tokenizer": tok.model_dump(mode="json"),
        "token_dtype": np.dtype(dtype).name, "sa_dtype": sa_dtype.name,
        "sentinel": sentinel, "tokens": start, "parts": parts_meta, "shards": shards_meta,
        "bytes_per_token": nbytes / start, "verified": opened.verified,
    }
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return {"tokens": start, "parts": len(groups), "shards": len(opened.shards),
            "bytes": nbytes, "bytes_per_token": nbytes / start}


# --------------------------------------------------------------------------- queries


@dataclass
class LongestMatch:
    """∞-gram answer: ``length`` tokens of the context's suffix occur ``count`` times;
    ``next_tokens``/``next_counts`` (int64[k]) are the top-k followers (-1/0 padded)."""

    length: int
    count: int
    next_tokens: np.ndarray
    next_counts: np.ndarray


@dataclass
class Occurrence:
    shard: str
    position: int  # token offset within the shard
    document: str  # document key


def _as_ids(x, what: str = "n-gram") -> np.ndarray:
    """One query as int64[m]: a sequence or 1-D array of integer token ids.

    Raises:
        IndexError_: not 1-D, not integers, or an id beyond int64.
    """
    try:
        a = None if isinstance(x, (str, bytes)) else np.asarray(x)
    except (ValueError, TypeError):
        a = None
    if a is None or a.ndim != 1:
        raise IndexError_(f"a {what} is a 1-D sequence of token ids, not {x!r:.60}")
    if a.size == 0:
        return np.zeros(0, np.int64)
    if a.dtype.kind not in "iu":
        raise IndexError_(f"a {what} holds integer token ids, not {a.dtype} ({x!r:.60})")
    if a.dtype.kind == "u" and int(a.max()) >= 2**63:
        raise IndexError_(f"token id {int(a.max())} outside the vocabulary")
    return a.astype(np.int64, copy=False)


def _check_k(k: int, what: str = "k") -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0:
        raise IndexError_(f"{what} must be an integer >= 0, not {k!r}")
    return int(k)


def _flatten(queries: Sequence[Sequence[int]] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(queries, np.ndarray) and queries.ndim != 2:
        raise IndexError_(f"a batch of n-grams is a list of sequences or a 2-D array, got "
                          f"an array of {queries.ndim} dimensions")
    if isinstance(queries, np.ndarray) and queries.ndim == 2:
        n, m = queries.shape
        return (np.ascontiguousarray(queries, dtype=np.int64).ravel(),
                np.arange(n + 1, dtype=np.int64) * m)
    qs = [_as_ids(q) for q in queries]  # any iterable of sequences
    lens = np.fromiter((q.size for q in qs), dtype=np.int64, count=len(qs))
    offs = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    flat = np.concatenate(qs) if qs else np.zeros(0, np.int64)
    return flat, offs


class SuffixArrayIndex:
    """A built index folder, memory-mapped. Token ids are checked against the vocabulary.

    Raises (constructor):
        IndexError_: the folder is not a tokenmill suffix-array index or its files are
            truncated.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.exists():
            raise IndexError_(f"{meta_path}: missing (not an index folder; build one with "
                              "`tokenmill ngram build MANIFEST -o DIR`)")
        try:
            self.meta = json.loads(meta_path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise IndexError_(f"{meta_path}: not valid JSON ({e})") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
            fmt = self.meta.get("format") if isinstance(self.meta, dict) else None
            raise IndexError_(f"{meta_path}: format {fmt!r} != {FORMAT}")
        try:
            self.tokenizer = TokenizerIdentity(**self.meta["tokenizer"])
            self.sentinel = int(self.meta["sentinel"])
            n = int(self.meta["tokens"])
            tdt = np.dtype(self.meta["token_dtype"]).newbyteorder("<")
            sdt = np.dtype(self.meta["sa_dtype"]).newbyteorder("<")
            starts = [int(p["start"]) for p in self.meta["parts"]]
        except (KeyError, TypeError, ValueError) as e:
            raise IndexError_(f"{meta_path}: malformed ({type(e).__name__}: {e})") from None
        self.eot = self.tokenizer.eot_token
        self.n_vocab = self.tokenizer.n_vocab
        for name, dt in (("tokens.bin", tdt), ("sa.bin", sdt)):
            size = (self.folder / name).stat().st_size
            if size != n * dt.itemsize:
                raise IndexError_(f"{self.folder / name}: {size} bytes, expected "
                                  f"{n * dt.itemsize} for {n} tokens")
        # copy-on-write maps: never written, but writable arrays dispatch faster in numba
        self.tokens = np.asarray(np.memmap(self.folder / "tokens.bin", dtype=tdt, mode="c"))
        self.sa = np.asarray(np.memmap(self.folder / "sa.bin", dtype=sdt, mode="c"))
        self.parts = np.array(starts + [n], dtype=np.int64)
        # every suffix-array entry must point into its part, or a query would read out of
        # bounds: one sequential pass over sa.bin (about 0.05 s per 10 M tokens)
        bad = _sa_out_of_range(self.sa, self.parts)
        if bad >= 0:
            raise IndexError_(f"{self.folder / 'sa.bin'}: entry {bad} = {int(self.sa[bad])} "
                              "points outside its part (corrupt index; rebuild it)")
        self._docs = None

    @classmethod
    def from_tokens(cls, parts: Sequence[np.ndarray], *, eot: int, n_vocab: int,
                    tokenizer: TokenizerIdentity | None = None) -> SuffixArrayIndex:
        """An in-memory index (no folder, no document table: :meth:`find` is unavailable)
        over token arrays, one part each, with the on-disk layout's conventions: every part
        is followed by the sentinel, reported as EOT, and its suffix array (libdivsufsort)
        holds global positions.

        Args:
            parts: 1-D integer token arrays (ids in ``[0, n_vocab)``); empty ones skipped.
            eot: the EOT id; n_vocab: the vocabulary size.
            tokenizer: recorded as the index's tokenizer (``None``: unnamed).

        Raises:
            IndexError_: a token id outside the vocabulary, or 2**31 tokens or more.
        """
        dtype = np.uint16 if n_vocab < 2**16 - 1 else np.uint32
        sentinel = int(np.iinfo(dtype).max)
        arrs = [np.asarray(p) for p in parts if len(p)]
        n = sum(a.size for a in arrs) + len(arrs)
        if n >= 2**31 - 1:
            raise IndexError_(f"an in-memory index holds < 2**31 tokens, not {n:,}")
        tokens = np.empty(n, dtype)
        sa = np.empty(n, np.uint32)
        starts, o = [], 0
        for a in arrs:
            if int(a.min()) < 0 or int(a.max()) >= n_vocab:
                bad = int(a[(a < 0) | (a >= n_vocab)][0])
                raise IndexError_(f"token id {bad} outside the vocabulary [0, {n_vocab})")
            tokens[o:o + a.size] = a
            tokens[o + a.size] = sentinel
            sa[o:o + a.size + 1] = integer_suffix_array(
                tokens[o:o + a.size + 1]).astype(np.int64) + o
            starts.append(o)
            o += a.size + 1
        self = cls.__new__(cls)
        self.folder, self.tokenizer, self.sentinel = None, tokenizer, sentinel
        self.meta = {"tokens": n, "parts": [{"start": s} for s in starts], "shards": []}
        self.eot, self.n_vocab = int(eot), int(n_vocab)
        self.tokens, self.sa = tokens, sa
        self.parts = np.array(starts + [n], dtype=np.int64)
        self._docs = None
        return self

    # -- helpers
    @property
    def n_tokens(self) -> int:
        """Indexed tokens, one sentinel per part excluded."""
        return int(self.meta["tokens"]) - (self.parts.size - 1)

    def _check(self, flat: np.ndarray) -> None:
        if flat.size and (flat.min() < 0 or flat.max() >= self.n_vocab):
            bad = int(flat[(flat < 0) | (flat >= self.n_vocab)][0])
            raise IndexError_(f"token id {bad} outside the vocabulary [0, {self.n_vocab}) of "
                              f"{self.tokenizer.short()}")

    # -- count
    def count(self, ngram: Sequence[int]) -> int:
        """Occurrences of ``ngram`` (1-D token ids) in the index; 0 if EOT appears anywhere
        but first. The empty n-gram counts every token."""
        q = _as_ids(ngram)
        c = _count_single(self.tokens, self.sa, self.parts, q, self.eot, self.n_vocab)
        if c < 0:
            self._check(q)
        return int(c)

    def count_batch(self, ngrams: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
        """Counts (int64[n]) of n n-grams (a list of sequences, or an int (n, m) array);
        runs on numba threads."""
        flat, offs = _flatten(ngrams)
        self._check(flat)
        out = _count_batch(self.tokens, self.sa, self.parts, flat, offs, self.eot)
        out[np.diff(offs) == 0] -= self.parts.size - 1
        return out

    # -- next-token distribution
    def next_token_distribution(self, context: Sequence[int],
                                k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Counts of each token that follows ``context`` in the index.

        Returns:
            ``(tokens, counts)``, int64. With ``k=None`` the full distribution sorted by
            token id; else the top-k by count (ties: lower id first), padded with -1/0.
        """
        q = _as_ids(context, "context")
        self._check(q)
        rt, rc = _next_dist(self.tokens, self.sa, self.parts, q, 0, q.size, self.eot,
                            self.sentinel, self.n_vocab)
        if k is None:
            return rt, rc
        k = _check_k(k)
        ot, oc = np.empty(k, np.int64), np.empty(k, np.int64)
        _topk(rt, rc, k, ot, oc)
        return ot, oc

    def next_token_topk_batch(self, contexts: Sequence[Sequence[int]] | np.ndarray,
                              k: int = 8) -> tuple[np.ndarray, np.ndarray]:
        """Top-k followers of each context: ``(tokens int64[n, k], counts int64[n, k])``."""
        k = _check_k(k)
        flat, offs = _flatten(contexts)
        self._check(flat)
        return _next_topk_batch(self.tokens, self.sa, self.parts, flat, offs, self.eot,
                                self.sentinel, self.n_vocab, k)

    # -- longest match
    def longest_match(self, context: Sequence[int], k: int = 8,
                      max_len: int = 0) -> LongestMatch:
        """∞-gram query: the longest suffix of ``context`` (containing EOT at most as its
        first token, so it stays inside one document) that occurs in the index, its count
        and its top-k next tokens. ``max_len > 0`` caps the suffix length."""
        q = _as_ids(context, "context")
        k, max_len = _check_k(k), _check_k(max_len, "max_len")
        self._check(q)
        L, c, t, n = _longest_single(self.tokens, self.sa, self.parts, q, self.eot,
                                     self.sentinel, self.n_vocab, k, max_len)
        return LongestMatch(int(L), int(c), t, n)

    def longest_match_batch(self, contexts: Sequence[Sequence[int]] | np.ndarray, k: int = 8,
                            max_len: int = 0):
        """Batched ∞-gram: ``(lengths int64[n], counts int64[n], next_tokens int64[n,k],
        next_counts int64[n,k])``; ``k=0`` skips the next-token part."""
        k, max_len = _check_k(k), _check_k(max_len, "max_len")
        flat, offs = _flatten(contexts)
        self._check(flat)
        return _longest_batch(self.tokens, self.sa, self.parts, flat, offs, self.eot,
                              self.sentinel, self.n_vocab, k, max_len)

    # -- find
    def _doc_table(self):
        if self._docs is None:
            if self.folder is None:
                raise IndexError_("an in-memory index (from_tokens) has no document table")
            try:
                with pq.ParquetFile(self.folder / "docs.parquet") as f:
                    t = f.read()
            except (OSError, pa.ArrowException) as e:
                raise IndexError_(f"{self.folder / 'docs.parquet'}: unreadable ({e})") from None
            self._docs = (t.column("pos").to_numpy(), t.column("key").to_pylist())
        return self._docs

    def find(self, ngram: Sequence[int], k: int = 10) -> list[Occurrence]:
        """The first ``k`` occurrences of ``ngram`` in corpus order (shard order, then
        position), each as (shard path relative to the manifest, token offset in the
        shard, document key)."""
        q = _as_ids(ngram)
        k = _check_k(k)
        self._check(q)
        pos = _positions(self.tokens, self.sa, self.parts, q, 0, q.size, self.eot)
        if q.size == 0:  # the empty n-gram: every token, not the parts' sentinels
            pos = pos[self.tokens[pos] != self.sentinel]
        pos = pos[:k]
        doc_pos, keys = self._doc_table()
        shard_starts = np.array([s["start"] for s in self.meta["shards"]], np.int64)
        p = np.searchsorted(shard_starts, pos, side="right") - 1  # vectorised: k may be all
        d = np.searchsorted(doc_pos, pos, side="right") - 1
        names = [s["shard"] for s in self.meta["shards"]]
        return [Occurrence(names[a], g, keys[b]) for a, g, b in
                zip(p.tolist(), (pos - shard_starts[p]).tolist(), d.tolist(), strict=True)]
