"""N-gram counts model: exact count tables of orders 2..8 with an interpolated
``P(next | context)``, built on Ray over a datamix's shards.

Tables. For every order ``n`` (``orders``, default 2..8) and every position whose
``n - 1`` preceding tokens stay inside one document (EOT only as their first token), the
pair (context, next token) is counted. A context is keyed by a 46-bit hash of its tokens
(splitmix64 chain, order mixed in), packed with the 18-bit next token into one uint64 so
that counting is one integer sort; the followers of each context are stored exactly,
sorted by count. Two different contexts of one order share a key with probability about
``C**2 / 2**47`` over ``C`` distinct contexts (~ 1e-3 for 10 M), so the counts are exact
in practice ("hashed count tables"). Order 1 is the unigram count.

Probability (interpolation by order and count; Witten-Bell / Dirichlet-prior style, the
mixing the modded-nanogpt n-gram record describes: the higher order's weight grows with
how often its context was seen)::

    P_1(t) = (c(t) + 1) / (N + V)
    P_n(t) = (c_n(ctx_n, t) + beta_n * P_{n-1}(t)) / (C_n(ctx_n) + beta_n)

so the weight of order ``n`` is ``C_n / (C_n + beta_n)`` (``beta_n = beta`` for every
order by default). An order whose context is unseen, crosses a document boundary or
starts before the row passes ``P_{n-1}`` through. Every ``P_n`` sums to 1 over the
vocabulary because ``C_n`` is the sum of that context's follower counts.

Build: one Ray task per shard counts (context key, next token) triplets with numba; the
driver merges them by sorting, so the result does not depend on the number of workers.
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
from tokenmill.manifests.schema import load_manifest
from tokenmill.tokenizers import TokenizerIdentity

FORMAT = "tokenmill-ngram-counts/1"
_GOLD = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(cache=True, inline="always")
def _mix(h):
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


TOKEN_BITS = 18  # vocabularies up to 262,144 ids (o200k_base fits)
_TOKEN_MASK = np.uint64((1 << TOKEN_BITS) - 1)
_CTX_MASK = ~_TOKEN_MASK


@nb.njit(cache=True)
def _ctx_hash(tokens, start, end, order):
    """Key of context tokens[start:end] for order ``order``: 46 hash bits in the high bits
    of a uint64, the low 18 bits zero (they hold the next token in a packed pair), never
    0 (0 marks an empty table slot)."""
    h = _mix(np.uint64(order) * _GOLD)
    for i in range(start, end):
        h = _mix(h ^ (np.uint64(tokens[i]) + _GOLD))
    return (h & _CTX_MASK) | (_TOKEN_MASK + np.uint64(1))


@nb.njit(cache=True)
def _pairs(tokens, order, eot):
    """Packed pairs ``ctx key | next token`` (uint64[m]) for positions whose order-1
    context is inside a document; the next token may be the next document's EOT (the
    document ends)."""
    n = tokens.size
    c = order - 1
    keys = np.empty(max(n - c, 0), np.uint64)
    m = 0
    for i in range(c, n):  # predict tokens[i] from tokens[i-c:i]
        ok = True
        for j in range(i - c + 1, i):
            if tokens[j] == eot:
                ok = False
                break
        if ok:
            keys[m] = _ctx_hash(tokens, i - c, i, order) | np.uint64(tokens[i])
            m += 1
    return keys[:m]


def _reduce(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct packed pairs and their counts (int64)."""
    u, c = np.unique(packed, return_counts=True)
    return u, c.astype(np.int64)


def _merge(parts: list[tuple[np.ndarray, np.ndarray]]):
    """Merge per-shard (packed, counts) -> (ctx keys, next tokens, counts), sorted by
    (key, token)."""
    packed = np.concatenate([p[0] for p in parts])
    cnt = np.concatenate([p[1] for p in parts])
    if len(parts) > 1 and packed.size:
        order = np.argsort(packed, kind="stable")
        packed, cnt = packed[order], cnt[order]
        new = np.ones(packed.size, bool)
        new[1:] = packed[1:] != packed[:-1]
        starts = np.flatnonzero(new)
        packed, cnt = packed[starts], np.add.reduceat(cnt, starts)
    return packed & _CTX_MASK, (packed & _TOKEN_MASK).astype(np.int64), cnt


def count_shard(path: str, orders: Sequence[int], eot: int, n_vocab: int) -> dict:
    """Count one shard: ``{"unigram": int64[V], order: (keys, next, counts)}``."""
    from tokenmill.manifests.shards import read_tokens

    tokens = np.asarray(read_tokens(path), dtype=np.int64)
    out: dict = {"unigram": np.bincount(tokens, minlength=n_vocab).astype(np.int64)}
    for n in orders:
        out[n] = _reduce(_pairs(tokens, n, eot))
    return out


@nb.njit(cache=True)
def _fill_table(keys, bits, tkeys, tidx, tstart, tend, ttotal, cnt, base_f, base_c):
    """Insert each run of equal context keys (sorted) into the open-addressing table
    (slot -> context index) and fill the per-context follower range and total."""
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    i = 0
    ci = base_c
    while i < keys.size:
        j = i
        tot = 0
        while j < keys.size and keys[j] == keys[i]:
            tot += cnt[j]
            j += 1
        s = (keys[i] * _GOLD) >> np.uint64(64 - bits)
        while tkeys[s] != 0:
            s = (s + np.uint64(1)) & mask
        tkeys[s] = keys[i]
        tidx[s] = ci
        tstart[ci] = base_f + i
        tend[ci] = base_f + j
        ttotal[ci] = tot
        ci += 1
        i = j


@nb.njit(cache=True)
def _order_by_count(keys, cnt):
    """Permutation sorting each run of equal keys by count desc (ties keep position, i.e.
    ascending token); runs are usually 1-3 long, so insertion sort, argsort for long."""
    perm = np.arange(keys.size)
    i = 0
    while i < keys.size:
        j = i + 1
        while j < keys.size and keys[j] == keys[i]:
            j += 1
        if j - i > 32:
            sub = np.argsort(-cnt[i:j], kind="mergesort")
            perm[i:j] = sub + i
        else:
            for a in range(i + 1, j):
                x = perm[a]
                b = a - 1
                while b >= i and cnt[perm[b]] < cnt[x]:
                    perm[b + 1] = perm[b]
                    b -= 1
                perm[b + 1] = x
        i = j
    return perm


def _build_tables(merged: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict:
    """Flat tables for all orders from per-order (keys, next, counts) sorted by (key, next).

    Layout: order ``o``'s hash table is slots ``toff[o]:toff[o+1]`` (``2**bits[o]``, load
    <= 0.7) of ``tkeys`` (uint64 context key, 0 = empty) and ``tidx`` (int64 context
    index). Context ``c`` has ``ttotal[c]`` occurrences and its followers at
    ``tstart[c]:tend[c]`` of ``f_tok/f_cnt`` (by count desc, token asc) and
    ``s_tok/s_cnt`` (by token).
    """
    bits, toff, n_ctx = [], [0], []
    for keys, _, _ in merged:
        n_ctx.append(int(np.count_nonzero(keys[1:] != keys[:-1]) + 1) if keys.size else 0)
        bits.append(max(10, int(np.ceil(np.log2(n_ctx[-1] / 0.7 + 2)))))
        toff.append(toff[-1] + (1 << bits[-1]))
    tkeys = np.zeros(toff[-1], np.uint64)
    tidx = np.zeros(toff[-1], np.int64)
    tstart = np.zeros(sum(n_ctx), np.int64)
    tend = np.zeros(sum(n_ctx), np.int64)
    ttotal = np.zeros(sum(n_ctx), np.int64)
    f_tok, f_cnt, s_tok, s_cnt = [], [], [], []
    f_base = c_base = 0
    for o, (keys, nxt, cnt) in enumerate(merged):
        sl = slice(toff[o], toff[o + 1])
        _fill_table(keys, bits[o], tkeys[sl], tidx[sl], tstart, tend, ttotal, cnt, f_base,
                    c_base)
        by_count = _order_by_count(keys, cnt)
        f_tok.append(nxt[by_count].astype(np.int32))
        f_cnt.append(cnt[by_count])
        s_tok.append(nxt.astype(np.int32))
        s_cnt.append(cnt)
        f_base += keys.size
        c_base += n_ctx[o]
    return {"tkeys": tkeys, "tidx": tidx, "tstart": tstart, "tend": tend, "ttotal": ttotal,
            "toff": np.asarray(toff, np.int64), "bits": np.asarray(bits, np.int64),
            "f_tok": np.concatenate(f_tok), "f_cnt": np.concatenate(f_cnt),
            "s_tok": np.concatenate(s_tok), "s_cnt": np.concatenate(s_cnt)}


@nb.njit(cache=True)
def _lookup(tkeys, toff, bits, o, key):
    """Global slot of context ``key`` in order ``o``'s table, or -1 (see :func:`_slots`
    for the context index)."""
    b = bits[o]
    mask = (np.uint64(1) << np.uint64(b)) - np.uint64(1)
    s = (np.uint64(key) * _GOLD) >> np.uint64(64 - b)
    base = toff[o]
    while True:
        k = tkeys[base + np.int64(s)]
        if k == key:
            return base + np.int64(s)
        if k == np.uint64(0):
            return np.int64(-1)
        s = (s + np.uint64(1)) & mask


@nb.njit(cache=True)
def _slots(row, t, orders, eot, tkeys, tidx, toff, bits, out):
    """out[o] = context index of order o's context ending at row[t], or -1 (unseen,
    before the row start, or holding EOT after its first token)."""
    for o in range(orders.size):
        n = orders[o]
        start = t - n + 2
        out[o] = -1
        if start < 0:
            continue
        ok = True
        for j in range(start + 1, t + 1):
            if row[j] == eot:
                ok = False
                break
        if ok:
            s = _lookup(tkeys, toff, bits, o, _ctx_hash(row, start, t + 1, n))
            out[o] = tidx[s] if s >= 0 else -1


@nb.njit(cache=True)
def _full_dist(row, t, orders, eot, unigram, n_uni, beta, tkeys, tidx, toff, bits, tstart,
               tend,
               ttotal, f_tok, f_cnt, out):
    """out[:] = P(. | row[..t]) (float64[V])."""
    V = unigram.size
    for v in range(V):
        out[v] = (unigram[v] + 1.0) / (n_uni + V)
    slots = np.empty(orders.size, np.int64)
    _slots(row, t, orders, eot, tkeys, tidx, toff, bits, slots)
    for o in range(orders.size):  # ascending order: P_n from P_{n-1}
        s = slots[o]
        if s < 0:
            continue
        tot = ttotal[s]
        scale = beta / (tot + beta)
        for v in range(V):
            out[v] *= scale
        inv = 1.0 / (tot + beta)
        for e in range(tstart[s], tend[s]):
            out[f_tok[e]] += f_cnt[e] * inv


@nb.njit(cache=True, parallel=True)
def _topk_batch(batch, orders, eot, unigram, n_uni, beta, tkeys, tidx, toff, bits, tstart,
                tend,
                ttotal, f_tok, s_tok, s_cnt, uni_top, k, m):
    B, T = batch.shape
    out_ids = np.full((B, T, k), -1, np.int32)
    out_p = np.zeros((B, T, k), np.float32)
    V = unigram.size
    n_ord = orders.size
    for bt in nb.prange(B * T):
        b = bt // T
        t = bt % T
        slots = np.empty(n_ord, np.int64)
        _slots(batch[b], t, orders, eot, tkeys, tidx, toff, bits, slots)
        cand = np.empty(uni_top.size + n_ord * m, np.int64)
        nc = 0
        for r in range(uni_top.size):
            cand[nc] = uni_top[r]
            nc += 1
        for o in range(n_ord):
            s = slots[o]
            if s >= 0:
                for e in range(tstart[s], min(tend[s], tstart[s] + m)):
                    cand[nc] = f_tok[e]
                    nc += 1
        cand = np.unique(cand[:nc])
        probs = np.empty(cand.size, np.float64)
        for ci in range(cand.size):
            tok = cand[ci]
            p = (unigram[tok] + 1.0) / (n_uni + V)
            for o in range(n_ord):
                s = slots[o]
                if s < 0:
                    continue
                lo, hi = tstart[s], tend[s]
                while lo < hi:  # binary search in the token-sorted followers
                    mid = (lo + hi) >> 1
                    if s_tok[mid] < tok:
                        lo = mid + 1
                    else:
                        hi = mid
                c = s_cnt[lo] if lo < tend[s] and s_tok[lo] == tok else 0
                p = (c + beta * p) / (ttotal[s] + beta)
            probs[ci] = p
        order = np.argsort(-probs, kind="mergesort")
        for r in range(min(k, cand.size)):
            out_ids[b, t, r] = cand[order[r]]
            out_p[b, t, r] = probs[order[r]]
    return out_ids, out_p


class NGramCountsModel:
    """Interpolated n-gram model over exact (64-bit-keyed) count tables.

    Build with :meth:`build` (Ray) and :meth:`save`; load with :meth:`load`.
    ``tables`` is the flat layout of :func:`_build_tables`.
    """

    def __init__(self, tokenizer: TokenizerIdentity, orders: Sequence[int], unigram: np.ndarray,
                 tables: dict[str, np.ndarray], beta: float = 1.0):
        self.tokenizer = tokenizer
        self.eot = tokenizer.eot_token
        self.n_vocab = tokenizer.n_vocab
        self.orders = np.asarray(orders, np.int64)
        self.unigram = np.asarray(unigram, np.int64)
        self.n_uni = int(self.unigram.sum())
        self.t = tables
        self.beta = float(beta)
        self.uni_top = np.argsort(-self.unigram, kind="mergesort")[:64].astype(np.int64)

    # -- build
    @classmethod
    def build(cls, manifest_path: str | os.PathLike, orders: Sequence[int] = range(2, 9),
              split: str | None = "train", beta: float = 1.0,
              ray_address: str | None = None, num_cpus: int = 2,
              progress: bool = True) -> NGramCountsModel:
        """Count every order over the manifest's ``split`` shards, one Ray task per shard.

        Starts an embedded Ray (``num_cpus``) unless Ray is initialised already or
        ``ray_address`` is given. Raises ``ValueError`` for orders outside 2..32 or a
        manifest without shards of ``split``.
        """
        import ray
        from tqdm import tqdm

        orders = sorted(set(int(o) for o in orders))
        if not orders or orders[0] < 2 or orders[-1] > 32:
            raise ValueError(f"orders must lie in 2..32, got {orders}")
        mpath = Path(manifest_path)
        manifest = load_manifest(mpath)
        root = mpath if mpath.is_dir() else mpath.parent
        shards = [str(root / s.path) for s in manifest.shards(split)]
        if not shards:
            raise ValueError(f"{mpath}: no shards with split={split!r}")
        tok = manifest.tokenizer
        if tok.n_vocab > 1 << TOKEN_BITS:
            raise ValueError(f"{mpath}: vocabulary of {tok.n_vocab} ids exceeds 2**{TOKEN_BITS}")
        if not ray.is_initialized():
            if ray_address:
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         log_to_driver=False)
        task = ray.remote(count_shard)
        refs = [task.remote(p, orders, tok.eot_token, tok.n_vocab) for p in shards]
        results = [ray.get(r) for r in tqdm(refs, desc="count shards", disable=not progress)]
        unigram = np.sum([r["unigram"] for r in results], axis=0)  # shard order: determinism
        tables = _build_tables([_merge([r[n] for r in results]) for n in orders])
        return cls(tok, orders, unigram, tables, beta)

    # -- persistence
    def save(self, folder: str | os.PathLike) -> None:
        """Write ``counts.npz`` + ``counts.json`` atomically into ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_open(out / "counts.npz") as f:
            np.savez(f, unigram=self.unigram, **self.t)
        meta = {"format": FORMAT, "tokenizer": self.tokenizer.model_dump(mode="json"),
                "orders": self.orders.tolist(), "beta": self.beta}
        atomic_write_text(out / "counts.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | os.PathLike) -> NGramCountsModel:
        """Load a saved model. Raises ``ValueError`` naming the file if it is not one."""
        p = Path(folder)
        meta = json.loads((p / "counts.json").read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{p / 'counts.json'}: format {meta.get('format')!r} != {FORMAT}")
        z = dict(np.load(p / "counts.npz"))
        unigram = z.pop("unigram")
        return cls(TokenizerIdentity(**meta["tokenizer"]), meta["orders"], unigram, z,
                   meta["beta"])

    # -- queries
    def count(self, context: Sequence[int], token: int) -> int:
        """Exact count of ``context`` followed by ``token`` (order ``len(context) + 1``
        must be one of the model's orders; 0 if unseen or crossing a document)."""
        n = len(context) + 1
        if n not in self.orders:
            raise ValueError(f"order {n} not in the model's orders {self.orders.tolist()}")
        o = int(np.flatnonzero(self.orders == n)[0])
        ctx = np.asarray(context, np.int64)
        t = self.t
        key = np.uint64(_ctx_hash(ctx, 0, ctx.size, n))
        s = _lookup(t["tkeys"], t["toff"], t["bits"], o, key)
        if s < 0:
            return 0
        s = t["tidx"][s]
        f = t["s_tok"][t["tstart"][s]:t["tend"][s]]
        j = int(np.searchsorted(f, token))
        return int(t["s_cnt"][t["tstart"][s] + j]) if j < f.size and f[j] == token else 0

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
        t = self.t
        for i, (r, c) in enumerate(pos.tolist()):
            _full_dist(b[r], c, self.orders, self.eot, self.unigram, self.n_uni, self.beta,
                       t["tkeys"], t["tidx"], t["toff"], t["bits"], t["tstart"], t["tend"],
                       t["ttotal"], t["f_tok"], t["f_cnt"], out[i])
        return out

    def topk(self, batch: np.ndarray, k: int = 8, candidates: int = 32
             ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k next tokens at every position of a (B, T) batch (numba threads).

        The candidates are each order's ``candidates`` most frequent followers plus the 64
        most frequent tokens; their probabilities are exact. Returns ``(ids int32[B, T, k],
        probs float32[B, T, k])``, sorted by probability.
        """
        b = self._batch(batch)
        t = self.t
        return _topk_batch(b, self.orders, self.eot, self.unigram, self.n_uni, self.beta,
                           t["tkeys"], t["tidx"], t["toff"], t["bits"], t["tstart"], t["tend"],
                           t["ttotal"], t["f_tok"], t["s_tok"], t["s_cnt"], self.uni_top, k,
                           candidates)


def build_counts(manifest_path: str | os.PathLike, out_dir: str | os.PathLike,
                 orders: Sequence[int] = range(2, 9), **kw) -> dict:
    """Build and save a :class:`NGramCountsModel`; returns a summary dict."""
    t0 = time.perf_counter()
    model = NGramCountsModel.build(manifest_path, orders, **kw)
    model.save(out_dir)
    return {"orders": model.orders.tolist(), "seconds": time.perf_counter() - t0,
            "contexts": {int(n): int((model.t["tkeys"][a:b] != 0).sum()) for n, a, b in
                         zip(model.orders, model.t["toff"][:-1], model.t["toff"][1:],
                             strict=True)}}
