"""N-gram counting: sparse pair counts of shards (the legality check's order-2 counts) and the
compact n-gram counts model of orders 2..32 with an interpolated ``P(next | context)``.

Counts model. The suffix-array index (:mod:`tokenmill.ngram.index`) already finds every
occurrence of any n-gram, so the counts model stores only what makes queries fast and
answers the rest exactly from the index:

* for every order ``n`` and every context of ``n - 1`` tokens (EOT only as its first token)
  that occurs at least ``min_count`` times in one part of the index, its followers (next
  token, count), sorted by token;
* nothing for rarer contexts: their ``< min_count`` occurrences are read from the suffix
  array at query time (one SA range search gives the context's count and its occurrences;
  the follower of each is the token after it).

A stored context is keyed exactly, not by a hash: by the start of its range in the suffix
array (suffixes sharing ``n - 1`` first tokens are contiguous, and ranges of one length are
disjoint), so a query finds it after the range search it does anyway. Build is one pass
over each part's suffix array with the LCP of neighbours (capped at the highest order),
in numba: a context is a run of LCP >= n - 1, its followers the sub-runs of LCP >= n. On
disk the keys are delta-coded (varint, LEB128) and so are the follower tokens within a
context; counts and run lengths are varints. Counting follows the index's conventions:
every occurrence has a next token (the end of a document, also a shard's or a part's last
one, is followed by EOT), so a context's count is the sum of its followers' counts.

Probability (interpolation by order and count; Witten-Bell / Dirichlet-prior style, the
mixing the modded-nanogpt n-gram record describes: the higher order's weight grows with
how often its context was seen)::

    P_1(t) = (c(t) + 1) / (N + V)
    P_n(t) = (c_n(ctx_n, t) + beta_n * P_{n-1}(t)) / (C_n(ctx_n) + beta_n)

so the weight of order ``n`` is ``C_n / (C_n + beta_n)`` (``beta_n = beta`` for every
order). An order whose context is unseen, crosses a document boundary or starts before the
row passes ``P_{n-1}`` through. Every ``P_n`` sums to 1 over the vocabulary because ``C_n``
is the sum of that context's follower counts.

Pair counts (:func:`count_pairs`, :func:`count_shards`): exact sparse counts of adjacent
pairs per shard (keys ``prev * n_vocab + next``), one Ray task per verified shard, merged in
key order so the result does not depend on the number of workers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numba as nb
import numpy as np

from tokenmill.atomic import atomic_open, atomic_write_text
from tokenmill.manifests.verify import OpenedShards
from tokenmill.ngram.index import SuffixArrayIndex, _range
from tokenmill.raysession import TaskCall, ray_session, run_tasks
from tokenmill.suffixarray import capped_lcp
from tokenmill.tokenizers import TokenizerIdentity

FORMAT = "tokenmill-ngram-counts/2"
MAX_ORDER = 32


# --------------------------------------------------------------------------- pair counts


def count_pairs(tokens: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Sparse adjacent-pair (order-2 n-gram) counts of one token stream.

    Args:
        tokens: 1-D integer token ids (uint16/uint32 shard memmap or any int array).
        n_vocab: vocabulary size (keys are ``prev * n_vocab + next``).

    Returns:
        ``(keys uint64[K] sorted, counts uint64[K])``.
    """
    t = np.asarray(tokens).astype(np.uint64, copy=False)
    if len(t) < 2:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    keys = t[:-1] * np.uint64(n_vocab) + t[1:]
    keys.sort()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    counts = np.diff(np.r_[starts, len(keys)]).astype(np.uint64)
    return keys[starts], counts


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge sparse ``(keys, counts)`` parts into one sorted sparse count (deterministic)."""
    if not parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    keys = np.concatenate([k for k, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    uk, inv = np.unique(keys, return_inverse=True)
    total = np.zeros(len(uk), dtype=np.uint64)
    np.add.at(total, inv, counts)
    return uk, total


def count_shard_pairs(path: str, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`count_pairs` of one shard file (already verified by the driver).

    Raises:
        ValueError: a token id is outside the vocabulary (naming shard and position).
    """
    from tokenmill.manifests.shards import read_tokens

    tokens = read_tokens(path)
    if len(tokens) and int(tokens.max()) >= n_vocab:
        bad = int(np.flatnonzero(np.asarray(tokens) >= n_vocab)[0])
        raise ValueError(f"{path}: token {int(tokens[bad])} at position {bad} is outside the "
                         f"vocabulary ({n_vocab})")
    return count_pairs(tokens, n_vocab)


def count_shards(opened: OpenedShards, ray_address: str | None = None,
                 num_cpus: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Pair counts of every shard of ``opened`` (from
    :func:`tokenmill.manifests.verify.open_shards`), one Ray task per shard
    (:func:`tokenmill.raysession.run_tasks`), merged in key order."""
    V = opened.manifest.tokenizer.n_vocab
    if not opened.shards:
        return merge_counts([])
    with ray_session(ray_address, num_cpus):
        parts = list(run_tasks([TaskCall(count_shard_pairs, (str(s.path), V), {"num_cpus": 1})
                                for s in opened.shards]))
    return merge_counts(parts)


# --------------------------------------------------------------------------- varints


@nb.njit(cache=True)
def _varint_encode(values):
    """LEB128 bytes of non-negative int64 values (7 bits per byte, high bit = more)."""
    out = np.empty(values.size * 10, np.uint8)
    n = 0
    for v in values:
        x = np.uint64(v)
        while x >= np.uint64(0x80):
            out[n] = np.uint8((x & np.uint64(0x7F)) | np.uint64(0x80))
            x >>= np.uint64(7)
            n += 1
        out[n] = np.uint8(x)
        n += 1
    return out[:n]


@nb.njit(cache=True)
def _varint_decode(data, count):
    """Inverse of :func:`_varint_encode`: ``count`` int64 values."""
    out = np.empty(count, np.int64)
    j = 0
    for i in range(count):
        x = np.uint64(0)
        shift = np.uint64(0)
        while True:
            b = np.uint64(data[j])
            j += 1
            x |= (b & np.uint64(0x7F)) << shift
            if b < np.uint64(0x80):
                break
            shift += np.uint64(7)
        out[i] = np.int64(x)
    return out


# --------------------------------------------------------------------------- build kernels


@nb.njit(cache=True)
def _order_runs(tokens, sa, lcp, s, e, L, min_count, eot, sentinel, keys, nf, ftok, fcnt,
                nk, nfo):
    """Append the contexts of length L with >= min_count occurrences in part [s, e) of the
    SA: key (SA index of the run start), follower count, followers (token asc, count).
    Returns the new (nk, nfo)."""
    i = s
    while i < e:
        j = i + 1
        while j < e and lcp[j - s] >= L:
            j += 1
        if j - i >= min_count:
            p = np.int64(sa[i])
            ok = True
            for k in range(1, L):
                if tokens[p + k] == eot:
                    ok = False
            if ok:
                first = nfo
                g = i
                while g < j:  # follower groups: sub-runs of lcp >= L + 1
                    h = g + 1
                    while h < j and lcp[h - s] > L:
                        h += 1
                    t = np.int64(tokens[np.int64(sa[g]) + L])
                    ftok[nfo] = eot if t == sentinel else t
                    fcnt[nfo] = h - g
                    nfo += 1
                    g = h
                # the sentinel (sorted last) stands for EOT: merge / move it into place
                last = nfo - 1
                if np.int64(tokens[np.int64(sa[j - 1]) + L]) == sentinel:
                    c = fcnt[last]
                    nfo -= 1
                    pos = first
                    while pos < nfo and ftok[pos] < eot:
                        pos += 1
                    if pos < nfo and ftok[pos] == eot:
                        fcnt[pos] += c
                    else:
                        for m in range(nfo, pos, -1):
                            ftok[m] = ftok[m - 1]
                            fcnt[m] = fcnt[m - 1]
                        ftok[pos] = eot
                        fcnt[pos] = c
                        nfo += 1
                keys[nk] = i
                nf[nk] = nfo - first
                nk += 1
        i = j
    return nk, nfo


@nb.njit(cache=True)
def _delta_within(ftok, nf):
    """Follower tokens as deltas from the previous follower of the same context."""
    out = np.empty(ftok.size, np.int64)
    o = 0
    for c in range(nf.size):
        prev = 0
        for _ in range(nf[c]):
            out[o] = ftok[o] - prev
            prev = ftok[o]
            o += 1
    return out


@nb.njit(cache=True)
def _undelta_within(dtok, nf):
    out = np.empty(dtok.size, np.int32)
    o = 0
    for c in range(nf.size):
        prev = 0
        for _ in range(nf[c]):
            prev += dtok[o]
            out[o] = prev
            o += 1
    return out


@nb.njit(cache=True)
def _by_count(fst, s_tok, s_cnt):
    """Followers of each context re-sorted by count desc, token asc (stable)."""
    f_tok = s_tok.copy()
    f_cnt = s_cnt.copy()
    for c in range(fst.size - 1):
        a, b = fst[c], fst[c + 1]
        if b - a > 1:
            perm = np.argsort(-s_cnt[a:b], kind="mergesort")
            for r in range(b - a):
                f_tok[a + r] = s_tok[a + perm[r]]
                f_cnt[a + r] = s_cnt[a + perm[r]]
    return f_tok, f_cnt


# --------------------------------------------------------------------------- query kernels


@nb.njit(cache=True)
def _context(tokens, sa, parts, row, t, L, eot, min_count, keys, ko, o, seg):
    """Occurrences of the order-(L+1) context row[t-L+1 .. t]: fills seg[p] = (a, b, ci)
    per part (SA range; ci = stored context index or -1) and returns the total count (0
    when the context starts before the row or holds EOT after its first token)."""
    start = t - L + 1
    for p in range(parts.size - 1):
        seg[p, 0] = 0
        seg[p, 1] = 0
        seg[p, 2] = -1
    if start < 0:
        return 0
    for j in range(start + 1, t + 1):
        if row[j] == eot:
            return 0
    total = 0
    for p in range(parts.size - 1):
        a, b = _range(tokens, sa, parts[p], parts[p + 1], row, start, L)
        seg[p, 0] = a
        seg[p, 1] = b
        total += b - a
        if b - a >= min_count:
            lo, hi = ko[o], ko[o + 1]
            i = lo + np.searchsorted(keys[lo:hi], a)
            seg[p, 2] = i  # stored by construction (every run >= min_count is)
    return total


@nb.njit(cache=True)
def add_followers(tokens, sa, seg, L, fst, f_tok, top, eot, sentinel, cand, nc):
    """Append to ``cand[nc:]`` the followers of one context in one part (``seg``: its
    occurrences' SA range ``[a, b)`` and its stored table ``ci``, -1 if none): the ``top``
    most frequent stored ones, or, for a context seen too rarely to be stored, the follower
    of every occurrence. Returns the new ``nc``."""
    a, b, ci = seg[0], seg[1], seg[2]
    if ci >= 0:
        for e in range(fst[ci], min(fst[ci + 1], fst[ci] + top)):
            cand[nc] = f_tok[e]
            nc += 1
    else:
        for i in range(a, b):
            cand[nc] = _follower(tokens, sa, i, L, eot, sentinel)
            nc += 1
    return nc


@nb.njit(cache=True)
def _follower(tokens, sa, i, L, eot, sentinel):
    t = np.int64(tokens[np.int64(sa[i]) + L])
    return eot if t == sentinel else t


@nb.njit(cache=True)
def _count_in(tokens, sa, seg, L, tok, eot, sentinel, fst, s_tok, s_cnt):
    """Count of follower ``tok`` over one context's segments (all parts)."""
    c = 0
    for p in range(seg.shape[0]):
        a, b, ci = seg[p, 0], seg[p, 1], seg[p, 2]
        if ci >= 0:
            lo, hi = fst[ci], fst[ci + 1]
            j = lo + np.searchsorted(s_tok[lo:hi], tok)
            if j < hi and s_tok[j] == tok:
                c += s_cnt[j]
        else:
            for i in range(a, b):
                if _follower(tokens, sa, i, L, eot, sentinel) == tok:
                    c += 1
    return c


@nb.njit(cache=True)
def _full_dist(tokens, sa, parts, row, t, orders, eot, sentinel, unigram, n_uni, beta,
               min_count, keys, ko, fst, s_tok, s_cnt, out):
    """out[:] = P(. | row[..t]) (float64[V])."""
    V = unigram.size
    for v in range(V):
        out[v] = (unigram[v] + 1.0) / (n_uni + V)
    seg = np.empty((parts.size - 1, 3), np.int64)
    for o in range(orders.size):  # ascending order: P_n from P_{n-1}
        L = orders[o] - 1
        tot = _context(tokens, sa, parts, row, t, L, eot, min_count, keys, ko, o, seg)
        if tot == 0:
            continue
        scale = beta / (tot + beta)
        for v in range(V):
            out[v] *= scale
        inv = 1.0 / (tot + beta)
        for p in range(seg.shape[0]):
            a, b, ci = seg[p, 0], seg[p, 1], seg[p, 2]
            if ci >= 0:
                for e in range(fst[ci], fst[ci + 1]):
                    out[s_tok[e]] += s_cnt[e] * inv
            else:
                for i in range(a, b):
                    out[_follower(tokens, sa, i, L, eot, sentinel)] += inv


@nb.njit(cache=True)
def _topk_one(tokens, sa, parts, row, t, orders, eot, sentinel, unigram, n_uni, beta,
              min_count, keys, ko, fst, s_tok, s_cnt, f_tok, uni_top, k, m, out_ids, out_p):
    """Top-k of P(. | row[..t]) among the candidates (each order's m most frequent
    followers per part, all followers of a context seen < min_count times in a part, plus
    uni_top), written to out_ids/out_p."""
    n_ord = orders.size
    n_p = parts.size - 1
    segs = np.empty((n_ord, n_p, 3), np.int64)
    tots = np.empty(n_ord, np.int64)
    cand = np.empty(uni_top.size + n_ord * n_p * max(m, min_count), np.int64)
    nc = 0
    for r in range(uni_top.size):
        cand[nc] = uni_top[r]
        nc += 1
    for o in range(n_ord):
        L = orders[o] - 1
        tots[o] = _context(tokens, sa, parts, row, t, L, eot, min_count, keys, ko, o, segs[o])
        for p in range(n_p):
            nc = add_followers(tokens, sa, segs[o, p], L, fst, f_tok, m, eot, sentinel,
                               cand, nc)
    cand = np.unique(cand[:nc])
    V = unigram.size
    probs = np.empty(cand.size, np.float64)
    for ci in range(cand.size):
        probs[ci] = (unigram[cand[ci]] + 1.0) / (n_uni + V)
    for o in range(n_ord):
        if tots[o] == 0:
            continue
        L = orders[o] - 1
        for ci in range(cand.size):
            c = _count_in(tokens, sa, segs[o], L, cand[ci], eot, sentinel, fst, s_tok, s_cnt)
            probs[ci] = (c + beta * probs[ci]) / (tots[o] + beta)
    order = np.argsort(-probs, kind="mergesort")
    for r in range(min(k, cand.size)):
        out_ids[r] = cand[order[r]]
        out_p[r] = probs[order[r]]


@nb.njit(cache=True, parallel=True)
def _topk_batch(tokens, sa, parts, batch, orders, eot, sentinel, unigram, n_uni, beta,
                min_count, keys, ko, fst, s_tok, s_cnt, f_tok, uni_top, k, m):
    B, T = batch.shape
    out_ids = np.full((B, T, k), -1, np.int32)
    out_p = np.zeros((B, T, k), np.float32)
    for bt in nb.prange(B * T):
        b = bt // T
        t = bt % T
        _topk_one(tokens, sa, parts, batch[b], t, orders, eot, sentinel, unigram, n_uni,
                  beta, min_count, keys, ko, fst, s_tok, s_cnt, f_tok, uni_top, k, m,
                  out_ids[b, t], out_p[b, t])
    return out_ids, out_p


# --------------------------------------------------------------------------- model


def check_orders(orders: Sequence[int]) -> list[int]:
    """Sorted distinct orders; ``ValueError`` unless they lie in 2..32 (checked before any
    work: the build and the CLI call it first)."""
    out = sorted(set(int(o) for o in orders))
    if not out or out[0] < 2 or out[-1] > MAX_ORDER:
        raise ValueError(f"orders must lie in 2..{MAX_ORDER}, got {out}")
    return out


class NGramCountsModel:
    """Interpolated n-gram model: compact follower tables of frequent contexts over a
    :class:`~tokenmill.ngram.index.SuffixArrayIndex`, which answers every other count.

    Build with :meth:`build` and :meth:`save`; load with :meth:`load`. ``tables`` holds, for
    the contexts of all orders (order ``o``'s at ``ko[o]:ko[o+1]``): ``keys`` (int64 SA index
    of the context's range start), ``fst`` (int64, context ``c``'s followers are
    ``fst[c]:fst[c+1]``), ``s_tok``/``s_cnt`` (followers by token) and ``f_tok``/``f_cnt``
    (by count desc, token asc).
    """

    def __init__(self, index: SuffixArrayIndex, orders: Sequence[int], unigram: np.ndarray,
                 tables: dict[str, np.ndarray], min_count: int, beta: float = 1.0):
        self.index = index
        self.tokenizer: TokenizerIdentity = index.tokenizer
        self.eot = index.eot
        self.n_vocab = index.n_vocab
        self.orders = np.asarray(orders, np.int64)
        self.unigram = np.asarray(unigram, np.int64)
        self.n_uni = int(self.unigram.sum())
        self.t = tables
        self.min_count = int(min_count)
        self.beta = float(beta)
        self.uni_top = np.argsort(-self.unigram, kind="mergesort")[:64].astype(np.int64)

    # -- build
    @classmethod
    def build(cls, index: SuffixArrayIndex | str | os.PathLike,
              orders: Sequence[int] = range(2, 9), beta: float = 1.0, min_count: int = 2,
              progress: bool = False) -> NGramCountsModel:
        """Count every order from the index's suffix array (one LCP pass per part).

        Args:
            index: a built index (or its folder); its shards were verified when it was built.
            orders: n-gram orders in 2..32.
            min_count: contexts seen at least this often in a part (>= 2) get stored
                followers; rarer ones are read from the suffix array at query time.

        Raises:
            ValueError: orders outside 2..32, or min_count < 2.
        """
        orders = check_orders(orders)
        if int(min_count) < 2:
            raise ValueError(f"min_count must be >= 2, not {min_count}")
        idx = index if isinstance(index, SuffixArrayIndex) else SuffixArrayIndex(index)
        toks = np.asarray(idx.tokens)
        unigram = np.bincount(toks[toks != idx.sentinel], minlength=idx.n_vocab).astype(np.int64)
        per_order = [([], [], [], []) for _ in orders]
        for p in range(idx.parts.size - 1):
            s, e = int(idx.parts[p]), int(idx.parts[p + 1])
            lcp = capped_lcp(idx.tokens, idx.sa, s, e, orders[-1])
            for o, n in enumerate(orders):
                keys, nf = np.empty(e - s, np.int64), np.empty(e - s, np.int64)
                ftok, fcnt = np.empty(e - s, np.int64), np.empty(e - s, np.int64)
                nk, nfo = _order_runs(idx.tokens, idx.sa, lcp, s, e, n - 1, int(min_count),
                                      idx.eot, idx.sentinel, keys, nf, ftok, fcnt, 0, 0)
                for lst, arr, m in zip(per_order[o], (keys, nf, ftok, fcnt),
                                       (nk, nk, nfo, nfo), strict=True):
                    lst.append(arr[:m].copy())
            del lcp
        enc = {}
        for o, lists in enumerate(per_order):
            keys, nf, ftok, fcnt = (np.concatenate(x) for x in lists)
            enc[f"keys_{o}"] = _varint_encode(np.diff(keys, prepend=0))
            enc[f"nf_{o}"] = _varint_encode(nf)
            enc[f"tok_{o}"] = _varint_encode(_delta_within(ftok, nf))
            enc[f"cnt_{o}"] = _varint_encode(fcnt)
            enc[f"n_{o}"] = np.array([keys.size, ftok.size], np.int64)
        enc["unigram"] = _varint_encode(unigram)
        return cls(idx, orders, unigram, _decode_tables(enc, len(orders)), min_count,
                   beta)._with_encoded(enc)

    def _with_encoded(self, enc: dict[str, np.ndarray]) -> NGramCountsModel:
        self._enc = enc
        return self

    # -- persistence
    def save(self, folder: str | os.PathLike) -> int:
        """Write ``counts.npz`` (varint streams) + ``counts.json`` atomically into ``folder``
        (the index is referenced by its path and its token count). Returns bytes on disk."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        enc = getattr(self, "_enc", None)
        if enc is None:
            raise ValueError("only a model made by build() can be saved (load keeps no copy)")
        with atomic_open(out / "counts.npz") as f:
            np.savez(f, **enc)
        rel = os.path.relpath(self.index.folder.resolve(), out.resolve())
        meta = {"format": FORMAT, "tokenizer": self.tokenizer.model_dump(mode="json"),
                "orders": self.orders.tolist(), "beta": self.beta,
                "min_count": self.min_count, "index": rel,
                "index_tokens": int(self.index.meta["tokens"])}
        atomic_write_text(out / "counts.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return sum((out / n).stat().st_size for n in ("counts.npz", "counts.json"))

    @classmethod
    def load(cls, folder: str | os.PathLike,
             index: SuffixArrayIndex | str | os.PathLike | None = None) -> NGramCountsModel:
        """Load a saved model and its index (default: the folder recorded at save time).

        Raises:
            ValueError: naming the file, if it is not a counts model of this format or the
                index is not the one it was built from.
        """
        p = Path(folder)
        meta_path = p / "counts.json"
        if not meta_path.exists():
            raise ValueError(f"{meta_path}: missing (build counts with `tokenmill ngram build "
                             "MANIFEST -o DIR --counts`)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT} "
                             "(rebuild with `tokenmill ngram build ... --counts`)")
        idx = index if isinstance(index, SuffixArrayIndex) else SuffixArrayIndex(
            index if index is not None else p / meta["index"])
        if int(idx.meta["tokens"]) != meta["index_tokens"]:
            raise ValueError(f"{meta_path}: built from an index of {meta['index_tokens']} "
                             f"tokens, but {idx.folder} holds {idx.meta['tokens']}")
        with np.load(p / "counts.npz") as z:
            enc = {k: z[k] for k in z.files}
        n_ord = len(meta["orders"])
        unigram = _varint_decode(enc["unigram"], idx.n_vocab)
        return cls(idx, meta["orders"], unigram, _decode_tables(enc, n_ord), meta["min_count"],
                   meta["beta"])

    # -- queries
    def count(self, context: Sequence[int], token: int) -> int:
        """Exact count of ``context`` followed by ``token`` (order ``len(context) + 1``
        must be one of the model's orders; 0 if unseen or crossing a document)."""
        n = len(context) + 1
        if n not in self.orders:
            raise ValueError(f"order {n} not in the model's orders {self.orders.tolist()}")
        o = int(np.flatnonzero(self.orders == n)[0])
        row = self._batch([list(context) + [int(token)]])[0]
        t, i = self.t, self.index
        seg = np.empty((i.parts.size - 1, 3), np.int64)
        if _context(i.tokens, i.sa, i.parts, row, n - 2, n - 1, self.eot, self.min_count,
                    t["keys"], t["ko"], o, seg) == 0:
            return 0
        return int(_count_in(i.tokens, i.sa, seg, n - 1, int(token), self.eot, i.sentinel,
                             t["fst"], t["s_tok"], t["s_cnt"]))

    def _batch(self, batch) -> np.ndarray:
        b = np.asarray(batch)
        if b.ndim != 2:
            raise ValueError(f"batch must be (B, T), got shape {b.shape}")
        if b.size and (b.min() < 0 or b.max() >= self.n_vocab):
            bad = int(b.max() if b.max() >= self.n_vocab else b.min())
            raise ValueError(f"token id {bad} outside the vocabulary [0, {self.n_vocab})")
        return np.ascontiguousarray(b, dtype=np.int64)

    def distribution(self, batch: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Full ``P(next | batch[b, :t+1])`` for chosen positions.

        Args:
            batch: int (B, T) tokens (rows independent; contexts never reach into another
                row or across an EOT).
            positions: int (M, 2) of (b, t).

        Returns:
            float64[M, V]; each row sums to 1.
        """
        b = self._batch(batch)
        pos = np.asarray(positions, np.int64).reshape(-1, 2)
        out = np.empty((pos.shape[0], self.n_vocab), np.float64)
        t, i = self.t, self.index
        for j, (r, c) in enumerate(pos.tolist()):
            _full_dist(i.tokens, i.sa, i.parts, b[r], c, self.orders, self.eot, i.sentinel,
                       self.unigram, self.n_uni, self.beta, self.min_count, t["keys"],
                       t["ko"], t["fst"], t["s_tok"], t["s_cnt"], out[j])
        return out

    def topk(self, batch: np.ndarray, k: int = 8, candidates: int = 32
             ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k next tokens at every position of a (B, T) batch (numba threads).

        The candidates are each order's ``candidates`` most frequent followers (per index
        part; every follower of a context seen fewer than ``min_count`` times there) plus
        the 64 most frequent tokens; their probabilities are exact. Returns
        ``(ids int32[B, T, k], probs float32[B, T, k])``, sorted by probability.
        """
        if not isinstance(k, int) or k < 1 or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"k and candidates must be integers >= 1, not {k!r}, "
                             f"{candidates!r}")
        b = self._batch(batch)
        t, i = self.t, self.index
        return _topk_batch(i.tokens, i.sa, i.parts, b, self.orders, self.eot, i.sentinel,
                           self.unigram, self.n_uni, self.beta, self.min_count, t["keys"],
                           t["ko"], t["fst"], t["s_tok"], t["s_cnt"], t["f_tok"],
                           self.uni_top, k, candidates)

    def next_tokens(self, context: Sequence[int], k: int = 10
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k next tokens after ``context`` (a non-empty token list) with their
        probabilities: ``(ids int32[<=k], probs float32[<=k])``."""
        if not len(context):
            raise ValueError("the context is empty: give at least one token")
        ids, probs = self.topk(np.asarray([list(context)]), k=k)
        keep = ids[0, -1] >= 0
        return ids[0, -1][keep], probs[0, -1][keep]


def _decode_tables(enc: dict[str, np.ndarray], n_orders: int) -> dict[str, np.ndarray]:
    """In-memory tables (see :class:`NGramCountsModel`) from the varint streams."""
    keys, nfs, toks, cnts, ko = [], [], [], [], [0]
    for o in range(n_orders):
        n_ctx, n_fol = (int(x) for x in enc[f"n_{o}"])
        keys.append(np.cumsum(_varint_decode(enc[f"keys_{o}"], n_ctx)))
        nf = _varint_decode(enc[f"nf_{o}"], n_ctx)
        nfs.append(nf)
        toks.append(_undelta_within(_varint_decode(enc[f"tok_{o}"], n_fol), nf))
        cnts.append(_varint_decode(enc[f"cnt_{o}"], n_fol).astype(np.int32))
        ko.append(ko[-1] + n_ctx)
    fst = np.zeros(ko[-1] + 1, np.int64)
    np.cumsum(np.concatenate(nfs), out=fst[1:])
    s_tok = np.concatenate(toks)
    s_cnt = np.concatenate(cnts)
    f_tok, f_cnt = _by_count(fst, s_tok, s_cnt)
    return {"keys": np.concatenate(keys).astype(np.int64), "ko": np.asarray(ko, np.int64),
            "fst": fst, "s_tok": s_tok, "s_cnt": s_cnt, "f_tok": f_tok, "f_cnt": f_cnt}


def build_counts(index: SuffixArrayIndex | str | os.PathLike, out_dir: str | os.PathLike,
                 orders: Sequence[int] = range(2, 9), **kw) -> dict:
    """Build and save a :class:`NGramCountsModel` from a built index.

    Returns:
        ``orders``, ``seconds`` (build + save), ``bytes`` (on disk), ``contexts`` (stored
        contexts per order) and ``followers`` (stored (context, next) pairs per order).
    """
    t0 = time.perf_counter()
    model = NGramCountsModel.build(index, orders, **kw)
    nbytes = model.save(out_dir)
    ko = model.t["ko"]
    fst = model.t["fst"]
    return {"orders": model.orders.tolist(), "seconds": time.perf_counter() - t0,
            "bytes": nbytes,
            "contexts": {int(n): int(ko[o + 1] - ko[o]) for o, n in enumerate(model.orders)},
            "followers": {int(n): int(fst[ko[o + 1]] - fst[ko[o]])
                          for o, n in enumerate(model.orders)}}
