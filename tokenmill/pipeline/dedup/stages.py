"""The two global (cross-document) stages: exact and MinHash-LSH fuzzy deduplication.

Both have the :class:`~tokenmill.pipeline.stage.GlobalStep` shape: per-block columns
computed on the workers, then a decision over all blocks in the global document order
(source, unit, row). ``tokenmill run`` takes the decisions in hash partitions on Ray
(:mod:`tokenmill.pipeline.dedup.partitioned`, nothing per document on the driver); the
:meth:`decide` methods here are the single-process reference it is tested against (one
process holds a 16-byte hash and a key per document for exact dedup, ``num_perm * 4``
bytes and a key per exact-unique document for fuzzy dedup).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from tokenmill.pipeline.dedup.minhash import (
    fuzzy_dedup_signatures,
    jaccard_detail,
    minhash_signatures,
)
from tokenmill.pipeline.stage import BlockColumns, Document, GlobalStep, Removals


def text_hash(text: str) -> bytes:
    """16-byte blake2b of the UTF-8 text: the exact-dedup key (collisions ~2^-64 at 2^32 docs)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class ExactDedup(GlobalStep):
    """Exact dedup: the first occurrence of a normalized text in the global document
    order (source, unit, row) is kept; later ones are removed with ``duplicate_of`` the
    first one's key."""

    name = "exact_dedup"
    version = 1
    columns = ("hash",)

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``hash``: binary(16) :func:`text_hash` per document."""
        return {"hash": pa.array([text_hash(d.text) for d in docs], pa.binary(16))}

    def decide(self, blocks: BlockColumns, removals: list[Removals],
               progress: bool = False) -> dict[str, Any] | None:
        first: dict[bytes, str] = {}
        for i in tqdm(range(len(blocks)), desc="exact dedup", unit="block",
                      disable=not progress):
            t = blocks.read(i, ["key", "hash"])
            d = removals[i]
            for k, h in zip(t.column("key").to_pylist(), t.column("hash").to_pylist(),
                            strict=True):
                kept = first.setdefault(h, k)
                if kept != k:
                    d[k] = [kept, self.name, None]
        return None


def read_signatures(table: pa.Table, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint32[n, num_perm] MinHash signatures, int64[n] shingle counts) of a block's
    ``minhash`` and ``shingles`` columns."""
    col = table.column("minhash").combine_chunks()
    raw = col.buffers()[1]
    sig = np.frombuffer(raw, dtype="<u4", count=len(col) * num_perm,
                        offset=col.offset * 4 * num_perm).reshape(len(col), num_perm)
    return sig, table.column("shingles").to_numpy()


class MinHashDedup(GlobalStep):
    """MinHash-LSH fuzzy dedup over the documents exact dedup kept (see
    :mod:`tokenmill.pipeline.dedup.minhash`): a document is removed only if its exact shingle
    Jaccard with a kept document of its cluster is at least ``threshold`` (the candidates'
    texts are read again from their blocks; ``exact_check=False``: the former
    estimate-only decision); the lowest key of a cluster is kept. An exact duplicate of
    a document this stage removed then points to the document actually kept."""

    name = "fuzzy_dedup"
    version = 1
    columns = ("minhash", "shingles")

    def __init__(self, threshold: float = 0.8, ngram: int = 5, num_perm: int = 128,
                 seed: int = 1, exact_check: bool = True) -> None:
        super().__init__(threshold=threshold, ngram=ngram, num_perm=num_perm, seed=seed,
                         exact_check=exact_check)

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``minhash``: binary(4 * num_perm) little-endian uint32 signature; ``shingles``:
        int64 shingle count (0 for a document shorter than one shingle)."""
        f = self.config
        sig, nsh = minhash_signatures([d.text for d in docs], num_perm=f["num_perm"],
                                      seed=f["seed"], ngram=f["ngram"],
                                      return_shingle_counts=True)
        sig = np.ascontiguousarray(sig, dtype="<u4").reshape(len(docs), f["num_perm"])
        # a document shorter than one shingle is never called a near-duplicate: after
        # shingle normalization '-1' and '1', or 'NULL' and 'null', would be "identical"
        nsh = np.where([len(d.text.split()) >= f["ngram"] for d in docs], nsh, 0)
        return {"minhash": pa.array([row.tobytes() for row in sig], pa.binary(4 * f["num_perm"])),
                "shingles": pa.array(np.asarray(nsh, dtype=np.int64), pa.int64())}

    def _gather(self, blocks: BlockColumns, removals: list[Removals], progress: bool):
        keys_all: list[str] = []
        sigs, counts, owner, starts = [], [], {}, [0]
        num_perm = self.config["num_perm"]
        for i in tqdm(range(len(blocks)), desc="fuzzy dedup", unit="block",
                      disable=not progress):
            t = blocks.read(i, ["key", "minhash", "shingles"])
            keys = t.column("key").to_pylist()
            sig, nsh = read_signatures(t, num_perm)
            keep = [j for j, k in enumerate(keys) if k not in removals[i]]
            keys_all += [keys[j] for j in keep]
            sigs.append(sig[keep])
            counts.append(nsh[keep])
            owner.update({keys[j]: i for j in keep})
            starts.append(len(keys_all))
        sig = np.concatenate(sigs) if sigs else np.empty((0, num_perm), np.uint32)
        nsh = np.concatenate(counts) if counts else np.empty(0, np.int64)
        return keys_all, sig, nsh, owner, starts

    @staticmethod
    def _texts_of(blocks: BlockColumns, removals: list[Removals], starts: list[int]):
        """``texts_of`` for the exact check: the texts of the gathered documents at the
        ascending indices ``idx``, read block by block (only the candidates' blocks)."""
        def texts_of(idx: np.ndarray):
            block_of = np.searchsorted(starts, idx, side="right") - 1
            for i in np.unique(block_of):
                t = blocks.read(int(i), ["key", "text"])
                keys = t.column("key").to_pylist()
                rows = [j for j, k in enumerate(keys) if k not in removals[i]]
                texts = t.column("text")
                for g in idx[block_of == i] - starts[i]:
                    yield texts[rows[g]].as_py()
        return texts_of

    def decide(self, blocks: BlockColumns, removals: list[Removals],
               progress: bool = False) -> dict[str, Any] | None:
        """Adds the near duplicates to ``removals``; returns the manifest record
        (``params``, ``counters``, ``cluster_sizes``: size -> clusters)."""
        f = self.config
        keys_all, sig, nsh, owner, starts = self._gather(blocks, removals, progress)
        res = fuzzy_dedup_signatures(keys_all, sig, nsh, threshold=f["threshold"],
                                     ngram=f["ngram"], seed=f["seed"],
                                     exact_check=f["exact_check"],
                                     texts_of=self._texts_of(blocks, removals, starts))
        for key, (kept, jac) in sorted(res.removed.items()):
            removals[owner[key]][key] = [kept, self.name,
                                         jaccard_detail(jac, f["exact_check"])]
        # an exact duplicate of a document that fuzzy dedup then removed points to the
        # document actually kept (its text equals the removed one's, so it is as similar)
        for d in removals:
            for entry in d.values():
                if entry[1] != self.name and entry[0] in res.removed:
                    entry[2] = f"same text as {entry[0]}"
                    entry[0] = res.removed[entry[0]][0]
        counters = {k: v for k, v in res.counters.items() if k != "seconds"}
        sizes = res.cluster_sizes
        return {"params": res.params, "counters": counters,
                "cluster_sizes": {str(s): sizes.count(s) for s in sorted(set(sizes))}}
