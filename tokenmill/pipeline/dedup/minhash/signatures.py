"""MinHash signatures of documents (numba, one thread) and their datasketch forms."""

from __future__ import annotations

import functools
import importlib.metadata
import itertools
from collections.abc import Iterable

import numpy as np

from tokenmill.pipeline.dedup.minhash.kernels import char_tables, signatures_kernel
from tokenmill.pipeline.dedup.minhash.reference import SCHEME, shingle_hash32
from tokenmill.tablecache import cached_arrays, source_sha256

_PAD = bytes(64)


@functools.lru_cache(maxsize=16)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's ``(a, b)`` permutations (uint32 ``(num_perm,)`` each) of a MinHash of
    ``num_perm`` and ``seed``: taken from datasketch once per machine, then loaded from
    :mod:`tokenmill.tablecache` (importing datasketch costs a Ray worker about 0.3 s)."""
    key = [num_perm, seed, SCHEME, importlib.metadata.version("datasketch"),
           source_sha256(__file__)]
    return cached_arrays("minhash-permutations", key,  # type: ignore[return-value]
                         lambda: _datasketch_permutations(num_perm, seed))


def _datasketch_permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
    return a.astype(np.uint32), b.astype(np.uint32)


def minhash_signatures(
    texts: Iterable[str],
    num_perm: int = 128,
    seed: int = 1,
    ngram: int = 5,
    batch_size: int = 2048,
    return_shingle_counts: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """MinHash signatures of ``texts``.

    Returns a ``(n_docs, num_perm)`` uint32 array (with ``return_shingle_counts`` also an
    int64 ``(n_docs,)`` array of shingle counts). An empty document's row is all
    ``0xFFFFFFFF`` (datasketch's empty MinHash). Bit-identical to datasketch (see module
    docstring). Per document, Python only encodes the text to UTF-8; normalization (from
    tables) and word splitting (one pass over the bytes, 64 ASCII bytes at a time), word
    hashing, the shingle hashes and the minimum over permutations run in one numba kernel
    per batch.

    Raises:
        ValueError: ``num_perm``, ``ngram`` or ``batch_size`` < 1.
        TypeError: ``texts`` is one string, or holds something that is not a ``str`` (the
            message gives its index).
    """
    if num_perm < 1 or ngram < 1 or batch_size < 1:
        raise ValueError(f"num_perm, ngram and batch_size must be >= 1, got {num_perm}, "
                         f"{ngram}, {batch_size}")
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts is an iterable of documents (str), not a single "
                        f"{type(texts).__name__}")
    a, b = permutations(num_perm, seed)
    tables = char_tables()
    parts: list[np.ndarray] = []
    counts: list[np.ndarray] = []

    def flush(batch: list[bytes]) -> None:
        lens = np.fromiter(map(len, batch), np.int64, len(batch))
        off = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        batch.append(_PAD)  # lets the last document's tail take the 64-byte path too
        buf = np.frombuffer(b"".join(batch), np.uint8)
        batch.pop()
        out = np.empty((len(batch), num_perm), np.uint32)
        nsh = np.empty(len(batch), np.int64)
        signatures_kernel(buf, off, ngram, a, b, tables, out, nsh)
        parts.append(out)
        counts.append(nsh)

    it = iter(texts)
    done = 0
    while chunk := list(itertools.islice(it, batch_size)):
        try:
            batch = [t.encode("utf-8", "surrogatepass") for t in chunk]  # as utf8_bytes
        except AttributeError:
            i, t = next((i, t) for i, t in enumerate(chunk) if not isinstance(t, str))
            raise TypeError(f"document {done + i} is a {type(t).__name__}, not a str") from None
        flush(batch)
        done += len(chunk)
    sig = np.concatenate(parts) if parts else np.empty((0, num_perm), np.uint32)
    if return_shingle_counts:
        return sig, (np.concatenate(counts) if counts else np.empty(0, np.int64))
    return sig


def to_minhash(signature: np.ndarray, seed: int = 1):
    """A ``datasketch.MinHash`` (scheme affine32, hashfunc :func:`shingle_hash32`) holding
    ``signature`` (uint32 ``(num_perm,)``); ``update`` on it continues consistently."""
    from datasketch import MinHash

    a, b = permutations(len(signature), seed)
    return MinHash(seed=seed, hashfunc=shingle_hash32, hashvalues=np.asarray(signature),
                   permutations=(a, b), scheme=SCHEME)


def to_lean_minhash(signature: np.ndarray, seed: int = 1):
    """A ``datasketch.LeanMinHash`` of ``signature`` (for ``MinHashLSH`` and storage)."""
    from datasketch import LeanMinHash

    return LeanMinHash(seed=seed, hashvalues=np.asarray(signature), scheme=SCHEME)
