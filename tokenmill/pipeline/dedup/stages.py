"""The two global (cross-document) stages: exact and MinHash-LSH fuzzy deduplication.

Both have the :class:`~tokenmill.pipeline.stage.GlobalStep` shape: per-block columns
computed on the workers, then a decision over all blocks in the global document order
(source, unit, row), taken in hash partitions on Ray
(:mod:`tokenmill.pipeline.dedup.partitioned`, nothing per document on the driver).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.dedup.minhash import minhash_signatures
from tokenmill.pipeline.stage import Document, GlobalStep


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

