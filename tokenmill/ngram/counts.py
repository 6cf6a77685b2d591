"""N-gram counts model: exact count tables of orders 2..8 with an interpolated
``P(next | context)``, built on Ray over a datamix's shards.

Tables. For every order ``n`` (``orders``, default 2..8) and every position whose
``n - 1`` preceding tokens stay inside one document (EOT only as their first token), the
pair (context, next token) is counted. A context is keyed by a 64-bit hash of its tokens
(splitmix64 chain, order mixed in); the followers of each context are stored exactly, sorted
by count. Two different contexts share a key with probability ~ 2**-64 per pair, so the
counts are exact in practice ("hashed count tables"). Order 1 is the unigram count.

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
# per order: context table (keys, follower start/end, total) and the followers, by count
# (desc) and by token id
_NAMES = ("tkeys", "tstart", "tend", "ttotal", "f_tok", "f_cnt", "s_tok", "s_cnt")


@nb.njit(cache=True, inline="always")
def _mix(h):
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@nb.njit(cache=True)
def _ctx_hash(tokens, start, end, order):
    """64-bit key of tokens[start:end] for order ``order``; never 0 (0 = empty slot)."""
    h = _mix(np.uint64(order) * _GOLD)
    for i in range(start, end):
        h = _mix(h ^ (np.uint64(tokens[i]) + _GOLD))
    return h | np.uint64(1)


@nb.njit(cache=True)
def _pairs(tokens, order, eot):
    """(ctx key uint64[m], next int64[m]) for positions whose order-1 context is inside a
    document; the next token may be the next document's EOT (the document ends)."""
    n = tokens.size
    c = order - 1
    keys = np.empty(max(n - c, 0), np.uint64)
    nxt = np.empty(max(n - c, 0), np.int64)
    m = 0
    for i in range(c, n):  # predict tokens[i] from tokens[i-c:i]
        ok = True
        for j in range(i - c + 1, i):
            if tokens[j] == eot:
                ok = False
                break
        if ok:
            keys[m] = _ctx_hash(tokens, i - c, i, order)
            nxt[m] = tokens[i]
            m += 1
    return keys[:m], nxt[:m]


def _reduce(keys: np.ndarray, nxt: np.ndarray):
    """Sort (key, next) pairs and count runs -> (keys, next, counts)."""
    if keys.size == 0:
        return keys, nxt, np.zeros(0, np.int64)
    order = np.lexsort((nxt, keys))
    k, t = keys[order], nxt[order]
    new = np.ones(k.size, bool)
    new[1:] = (k[1:] != k[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, k.size))
    return k[starts], t[starts], counts.astype(np.int64)


def _merge(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    keys = np.concatenate([p[0] for p in parts])
    nxt = np.concatenate([p[1] for p in parts])
    cnt = np.concatenate([p[2] for p in parts])
    if keys.size == 0:
        return keys, nxt, cnt
    order = np.lexsort((nxt, keys))
    k, t, c = keys[order], nxt[order], cnt[order]
    new = np.ones(k.size, bool)
    new[1:] = (k[1:] != k[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(new)
    return k[starts], t[starts], np.add.reduceat(c, starts)


def count_shard(path: str, orders: Sequence[int], eot: int, n_vocab: int) -> dict:
    """Count one shard: ``{"unigram": int64[V], order: (keys, next, counts)}``."""
    from tokenmill.pipeline.shards import read_tokens

    tokens = np.asarray(read_tokens(path), dtype=np.int64)
    out: dict = {"unigram": np.bincount(tokens, minlength=n_vocab).astype(np.int64)}
    for n in orders:
        out[n] = _reduce(*_pairs(tokens, n, eot))
    return out


@nb.njit(cache=True)
def _build_table(keys, nxt, cnt, bits):
    """Open-addressing table ctx key -> (follower start, follower end, total count), and
    followers reordered by count (desc, then token asc) within each context."""
    size = np.int64(1) << bits
    mask = np.uint64(size - 1)
    tkeys = np.zeros(size, np.uint64)
    tstart = np.zeros(size, np.int64)
    tend = np.zeros(size, np.int64)
    ttotal = np.zeros(size, np.int64)
    f_tok = np.empty(nxt.size, np.int32)
    f_cnt = np.empty(nxt.size, np.int64)
    i = 0
    while i < keys.size:
        j = i
        tot = 0
        while j < keys.size and keys[j] == keys[i]:
            tot += cnt[j]
            j += 1
        order = np.argsort(-cnt[i:j], kind="mergesort")  # ties: ascending token
        for r in range(j - i):
            f_tok[i + r] = nxt[i + order[r]]
            f_cnt[i + r] = cnt[i + order[r]]
        s = (keys[i] * _GOLD) >> np.uint64(64 - bits)
        while tkeys[s] != 0:
            s = (s + np.uint64(1)) & mask
        tkeys[s] = keys[i]
        tstart[s] = i
        tend[s] = j
        ttotal[s] = tot
        i = j
    s_tok = nxt.astype(np.int32)  # followers by token id, for binary search
    return tkeys, tstart, tend, ttotal, f_tok, f_cnt, s_tok, cnt.copy()


@nb.njit(cache=True)
def _lookup(tkeys, bits, key):
    """Slot of context key ``key`` in an open-addressing table, or -1."""
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    s = (np.uint64(key) * _GOLD) >> np.uint64(64 - bits)
    while True:
        k = tkeys[s]
        if k == key:
            return np.int64(s)
        if k == np.uint64(0):
            return np.int64(-1)
        s = (s + np.uint64(1)) & mask


@nb.njit(cache=True)
def _full_dist(row, t, orders, eot, unigram, n_uni, beta, tkeys, tstart, tend, ttotal,
               f_tok, f_cnt, s_tok, s_cnt, bits, out):
    """out[:] = P(. | row[..t]) (float64[V])."""
    V = unigram.size
    for v in range(V):
        out[v] = (unigram[v] + 1.0) / (n_uni + V)
    for oi in range(orders.size):
        n = orders[oi]
        c = n - 1
        start = t - c + 1
        if start < 0:
            continue
        ok = True
        for j in range(start + 1, t + 1):
            if row[j] == eot:
                ok = False
        if not ok:
            continue
        key = _ctx_hash(row, start, t + 1, n)
        s = _lookup(tkeys[oi], bits[oi], key)
        if s < 0:
            continue
        tot = ttotal[oi][s]
        scale = beta / (tot + beta)
        for v in range(V):
            out[v] *= scale
        inv = 1.0 / (tot + beta)
        for e in range(tstart[oi][s], tend[oi][s]):
            out[f_tok[oi][e]] += f_cnt[oi][e] * inv
    return out


@nb.njit(cache=True, parallel=True)
def _topk_batch(batch, orders, eot, unigram, n_uni, beta, tkeys, tstart, tend, ttotal,
                f_tok, f_cnt, s_tok, s_cnt, bits, uni_top, k, m):
    B, T = batch.shape
    out_ids = np.full((B, T, k), -1, np.int32)
    out_p = np.zeros((B, T, k), np.float32)
    V = unigram.size
    n_ord = orders.size
    for bt in nb.prange(B * T):
        b = bt // T
        t = bt % T
        row = batch[b]
        # per-order context slot (or -1), and the candidates
        slots = np.full(n_ord, -1, np.int64)
        for oi in range(n_ord):
            n = orders[oi]
            start = t - (n - 1) + 1
            if start < 0:
                continue
            ok = True
            for j in range(start + 1, t + 1):
                if row[j] == eot:
                    ok = False
            if ok:
                slots[oi] = _lookup(tkeys[oi], bits[oi], _ctx_hash(row, start, t + 1, n))
        cand = np.empty(uni_top.size + n_ord * m, np.int64)
        nc = 0
        for r in range(uni_top.size):
            cand[nc] = uni_top[r]
            nc += 1
        for oi in range(n_ord):
            s = slots[oi]
            if s >= 0:
                e_end = min(tend[oi][s], tstart[oi][s] + m)
                for e in range(tstart[oi][s], e_end):
                    cand[nc] = f_tok[oi][e]
                    nc += 1
        cand = np.unique(cand[:nc])
        probs = np.empty(cand.size, np.float64)
        for ci in range(cand.size):
            tok = cand[ci]
            p = (unigram[tok] + 1.0) / (n_uni + V)
            for oi in range(n_ord):
                s = slots[oi]
                if s < 0:
                    continue
                c = 0
                lo, hi = tstart[oi][s], tend[oi][s]
                while lo < hi:  # binary search in the token-sorted followers
                    mid = (lo + hi) >> 1
                    if s_tok[oi][mid] < tok:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < tend[oi][s] and s_tok[oi][lo] == tok:
                    c = s_cnt[oi][lo]
                p = (c + beta * p) / (ttotal[oi][s] + beta)
            probs[ci] = p
        order = np.argsort(-probs, kind="mergesort")
        for r in range(min(k, cand.size)):
            out_ids[b, t, r] = cand[order[r]]
            out_p[b, t, r] = probs[order[r]]
    return out_ids, out_p


class NGramCountsModel:
    """Interpolated n-gram model over exact (64-bit-keyed) count tables.

    Build with :meth:`build` (Ray) and :meth:`save`; load with :meth:`load`.
    """

    def __init__(self, tokenizer: TokenizerIdentity, orders: Sequence[int], unigram: np.ndarray,
                 tables: list[tuple[np.ndarray, ...]], bits: list[int], beta: float = 1.0):
        self.tokenizer = tokenizer
        self.eot = tokenizer.eot_token
        self.n_vocab = tokenizer.n_vocab
        self.orders = np.asarray(orders, np.int64)
        self.unigram = np.asarray(unigram, np.int64)
        self.n_uni = int(self.unigram.sum())
        self.tables = tables  # per order: arrays named by _NAMES
        self.bits = np.asarray(bits, np.int64)
        self.beta = float(beta)
        self.uni_top = np.argsort(-self.unigram, kind="mergesort")[:64].astype(np.int64)
        self._tl = [nb.typed.List([t[i] for t in tables]) for i in range(len(_NAMES))]

    # -- build
    @classmethod
    def build(cls, manifest_path: str | os.PathLike, orders: Sequence[int] = range(2, 9),
              split: str | None = "train", beta: float = 1.0,
              ray_address: str | None = None, num_cpus: int = 2,
              progress: bool = True) -> NGramCountsModel:
        """Count every order over the manifest's ``split`` shards, one Ray task per shard.

        Starts an embedded Ray (``num_cpus``) unless Ray is initialised already or
        ``ray_address`` is given. Raises ``ValueError`` for orders outside 2..32.
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
        if not ray.is_initialized():
            if ray_address:
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        task = ray.remote(count_shard)
        refs = [task.remote(p, orders, tok.eot_token, tok.n_vocab) for p in shards]
        results = []
        for r in tqdm(refs, desc="count shards", disable=not progress):
            results.append(ray.get(r))  # in shard order: deterministic merge
        unigram = np.sum([r["unigram"] for r in results], axis=0)
        tables, bits = [], []
        for n in orders:
            keys, nxt, cnt = _merge([r[n] for r in results])
            n_ctx = int(np.count_nonzero(np.diff(keys)) + 1) if keys.size else 0
            b = max(10, int(np.ceil(np.log2(2 * n_ctx + 2))))
            tables.append(_build_table(keys, nxt, cnt, b))
            bits.append(b)
        return cls(tok, orders, unigram, tables, bits, beta)

    # -- persistence
    def save(self, folder: str | os.PathLike) -> None:
        """Write ``counts.npz`` + ``meta.json`` atomically into ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        arrays = {"unigram": self.unigram}
        for n, t in zip(self.orders.tolist(), self.tables, strict=True):
            for name, a in zip(_NAMES, t, strict=True):
                arrays[f"o{n}_{name}"] = a
        with atomic_open(out / "counts.npz") as f:
            np.savez(f, **arrays)
        meta = {"format": FORMAT, "tokenizer": self.tokenizer.model_dump(mode="json"),
                "orders": self.orders.tolist(), "bits": self.bits.tolist(), "beta": self.beta}
        atomic_write_text(out / "counts.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | os.PathLike) -> NGramCountsModel:
        """Load a saved model. Raises ``ValueError`` naming the file if it is not one."""
        p = Path(folder)
        meta = json.loads((p / "counts.json").read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{p / 'counts.json'}: format {meta.get('format')!r} != {FORMAT}")
        z = np.load(p / "counts.npz")
        tables = [tuple(z[f"o{n}_{name}"] for name in _NAMES) for n in meta["orders"]]
        return cls(TokenizerIdentity(**meta["tokenizer"]), meta["orders"], z["unigram"],
                   tables, meta["bits"], meta["beta"])

    # -- queries
    def count(self, context: Sequence[int], token: int) -> int:
        """Exact count of ``context`` followed by ``token`` (order ``len(context) + 1``
        must be one of the model's orders; 0 if unseen)."""
        n = len(context) + 1
        oi = int(np.flatnonzero(self.orders == n)[0]) if n in self.orders else -1
        if oi < 0:
            raise ValueError(f"order {n} not in the model's orders {self.orders.tolist()}")
        ctx = np.asarray(context, np.int64)
        s = _lookup(self.tables[oi][0], self.bits[oi], _ctx_hash(ctx, 0, ctx.size, n))
        if s < 0:
            return 0
        t = self.tables[oi]
        f = t[6][t[1][s]:t[2][s]]
        j = int(np.searchsorted(f, token))
        return int(t[7][t[1][s] + j]) if j < f.size and f[j] == token else 0

    def _batch(self, batch) -> np.ndarray:
        b = np.asarray(batch)
        if b.ndim != 2:
            raise ValueError(f"batch must be (B, T), got shape {b.shape}")
        if b.size and (b.min() < 0 or b.max() >= self.n_vocab):
            raise ValueError(f"token id {int(b.max() if b.max() >= self.n_vocab else b.min())}"
                             f" outside the vocabulary [0, {self.n_vocab})")
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
        for i, (r, t) in enumerate(pos.tolist()):
            _full_dist(b[r], t, self.orders, self.eot, self.unigram, self.n_uni, self.beta,
                       *self._tl, self.bits, out[i])
        return out

    def topk(self, batch: np.ndarray, k: int = 8, candidates: int = 32
             ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k next tokens at every position of a (B, T) batch.

        The candidates are each order's ``candidates`` most frequent followers plus the 64
        most frequent tokens; their probabilities are exact. Returns ``(ids int32[B, T, k],
        probs float32[B, T, k])``, sorted by probability.
        """
        b = self._batch(batch)
        return _topk_batch(b, self.orders, self.eot, self.unigram, self.n_uni, self.beta,
                           *self._tl, self.bits, self.uni_top, k, candidates)


def build_counts(manifest_path: str | os.PathLike, out_dir: str | os.PathLike,
                 orders: Sequence[int] = range(2, 9), **kw) -> dict:
    """Build and save a :class:`NGramCountsModel`; returns a summary dict."""
    t0 = time.perf_counter()
    model = NGramCountsModel.build(manifest_path, orders, **kw)
    model.save(out_dir)
    return {"orders": model.orders.tolist(), "seconds": time.perf_counter() - t0,
            "contexts": {int(n): int((t[0] != 0).sum()) for n, t in
                         zip(model.orders, model.tables, strict=True)}}
