"""Observed adjacent token pairs of a shard set: sparse counts, built on Ray from a manifest.

``ObservedPairs`` counts every adjacent pair ``(prev, next)`` in the token stream of each
shard of a :class:`~tokenmill.manifests.schema.DatamixManifest` (documents are EOT-separated,
so pairs ``(last token, EOT)`` and ``(EOT, first token)`` are included; nothing is counted
across shard files). It serves two purposes:

* statistics: distinct pairs, totals, most frequent pairs;
* a soundness check of a :class:`~tokenmill.tokenizers.legality.LegalityTable`: an observed
  pair that the table marks impossible is a bug, reported with both tokens decoded.

Counting per shard is vectorised numpy (keys ``prev * n_vocab + next`` as uint64, sorted and
run-length counted); shards are counted in parallel as Ray tasks (embedded local Ray, or an
existing cluster with ``ray_address``) and merged in sorted key order, so the result is
identical for any number of workers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.atomic import atomic_open, sha256_file
from tokenmill.tokenizers import TokenizerIdentity, check_same


def count_pairs(tokens: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Sparse adjacent-pair counts of one token stream.

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


def _count_shard(path: str, n_vocab: int, sha256: str | None) -> tuple[np.ndarray, np.ndarray]:
    from tokenmill.manifests.shards import read_tokens

    if sha256 is not None:
        got = sha256_file(path)
        if got != sha256:
            raise ValueError(f"{path}: sha256 {got} does not match the manifest's {sha256}")
    tokens = read_tokens(path)
    if len(tokens) and int(tokens.max()) >= n_vocab:
        bad = int(np.flatnonzero(np.asarray(tokens) >= n_vocab)[0])
        raise ValueError(f"{path}: token {int(tokens[bad])} at position {bad} is outside the "
                         f"vocabulary ({n_vocab})")
    return count_pairs(tokens, n_vocab)


@dataclass(frozen=True)
class Violation:
    """An observed pair that a legality table marks impossible."""

    prev: int
    next: int
    count: int
    prev_text: str
    next_text: str

    def __str__(self) -> str:
        return (f"observed {self.count}x but marked impossible: {self.prev_text!r}({self.prev}) "
                f"-> {self.next_text!r}({self.next})")


class ObservedPairs:
    """Sparse counts of adjacent token pairs.

    Attributes:
        identity: tokenizer of the counted shards.
        keys: ``uint64[K]`` sorted pair keys ``prev * n_vocab + next``.
        counts: ``uint64[K]`` occurrences of each pair.
    """

    def __init__(self, ident: TokenizerIdentity, keys: np.ndarray, counts: np.ndarray) -> None:
        self.identity = ident
        self.keys = keys
        self.counts = counts

    @property
    def prev(self) -> np.ndarray:
        """``int64[K]`` previous token of each pair."""
        return (self.keys // np.uint64(self.identity.n_vocab)).astype(np.int64)

    @property
    def next(self) -> np.ndarray:
        """``int64[K]`` next token of each pair."""
        return (self.keys % np.uint64(self.identity.n_vocab)).astype(np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def total(self) -> int:
        """Number of adjacent pairs counted (sum of counts)."""
        return int(self.counts.sum())

    def count(self, a: int, b: int) -> int:
        """Occurrences of pair ``(a, b)``."""
        k = np.uint64(a) * np.uint64(self.identity.n_vocab) + np.uint64(b)
        i = int(np.searchsorted(self.keys, k))
        return int(self.counts[i]) if i < len(self.keys) and self.keys[i] == k else 0

    # ------------------------------------------------------------------ build
    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike, split: str | None = None,
                      ray_address: str | None = None, num_cpus: int = 2,
                      verify: bool = True) -> ObservedPairs:
        """Count the shards of a datamix manifest on Ray.

        Args:
            manifest: ``manifest.json`` or its folder.
            split: ``"train"``, ``"val"`` or None for all shards.
            ray_address: an existing Ray cluster; otherwise an embedded local Ray with
                ``num_cpus`` CPUs is started when none is running.
            verify: check each shard's sha256 against the manifest first.

        Raises:
            ValueError: a shard's checksum or a token id is wrong (naming the shard).
        """
        import ray

        from tokenmill.manifests.schema import load_manifest

        mpath = Path(manifest)
        folder = mpath if mpath.is_dir() else mpath.parent
        man = load_manifest(mpath)
        shards = man.shards(split)
        V = man.tokenizer.n_vocab
        if not ray.is_initialized():
            if ray_address:
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         log_to_driver=False,
                         configure_logging=False)
        task = ray.remote(num_cpus=1)(_count_shard)
        refs = [task.remote(str(folder / s.path), V, s.sha256 if verify else None)
                for s in shards]
        parts = ray.get(refs)
        keys, counts = merge_counts(parts)
        return cls(man.tokenizer, keys, counts)

    @classmethod
    def from_tokens(cls, ident: TokenizerIdentity, streams: list[np.ndarray]) -> ObservedPairs:
        """Count in-process (no Ray) over token streams (each counted separately)."""
        keys, counts = merge_counts([count_pairs(s, ident.n_vocab) for s in streams])
        return cls(ident, keys, counts)

    # ------------------------------------------------------------------ use
    def check(self, table, limit: int | None = None) -> list[Violation]:
        """Observed pairs the legality ``table`` marks impossible (should be empty).

        Raises:
            TokenizerMismatchError: the table was built for another tokenizer.
        """
        from tokenmill.tokenizers import get_encoding

        check_same(self.identity, table.identity, "legality table")
        ok = table.possible_pairs(self.prev, self.next)
        bad = np.flatnonzero(~ok)
        if limit is not None:
            bad = bad[:limit]
        enc = get_encoding(self.identity.name)
        out = []
        for i in bad:
            a, b = int(self.prev[i]), int(self.next[i])
            out.append(Violation(a, b, int(self.counts[i]), _decode(enc, a), _decode(enc, b)))
        return out

    def top(self, k: int = 20) -> list[tuple[int, int, int]]:
        """The ``k`` most frequent pairs as ``(prev, next, count)`` (ties by key)."""
        order = np.lexsort((self.keys, -self.counts.astype(np.int64)))[:k]
        return [(int(self.prev[i]), int(self.next[i]), int(self.counts[i])) for i in order]

    def save(self, path: str | os.PathLike) -> Path:
        """Write an ``.npz`` (keys, counts, identity JSON) atomically."""
        p = Path(path)
        with atomic_open(p) as f:
            np.savez(f, keys=self.keys, counts=self.counts,
                     identity=np.frombuffer(json.dumps(self.identity.model_dump()).encode(),
                                            dtype=np.uint8))
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> ObservedPairs:
        with np.load(path) as z:
            ident = TokenizerIdentity(**json.loads(z["identity"].tobytes()))
            return cls(ident, z["keys"], z["counts"])


def _decode(enc, t: int) -> str:
    try:
        return enc.decode_single_token_bytes(t).decode("utf-8", "backslashreplace")
    except KeyError:
        return f"<id {t}>"
