"""Observed adjacent token pairs of a shard set, and the legality check over shards.

``ObservedPairs`` is the order-2 n-gram count of a curation manifest's shards: every adjacent
pair ``(prev, next)`` in each shard's token stream (documents are EOT-separated, so pairs
``(last token, EOT)`` and ``(EOT, first token)`` are included; nothing is counted across shard
files). The counting is :mod:`tokenmill.ngram.counts`' (:func:`~tokenmill.ngram.counts.
count_pairs` per shard, :func:`~tokenmill.ngram.counts.count_shards` on Ray over the shards
that :func:`tokenmill.manifests.verify.open_shards` opened and verified). It serves two
purposes:

* statistics: distinct pairs, totals, most frequent pairs;
* a soundness check of a :class:`~tokenmill.tokenizers.legality.LegalityTable`: an observed
  pair that the table marks impossible is a bug, reported with both tokens decoded
  (``tokenmill ngram pairs MANIFEST --table DIR``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.atomic import atomic_open
from tokenmill.manifests.verify import open_shards
from tokenmill.ngram.counts import count_pairs, count_shards, merge_counts
from tokenmill.tokenizers import TokenizerIdentity, check_same, load_checked


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
        """Count the shards of a curation manifest on Ray.

        Args:
            manifest: ``manifest.json`` or its folder.
            split: ``"train"``, ``"val"`` or None for all shards.
            ray_address: an existing Ray cluster; otherwise an embedded local Ray with
                ``num_cpus`` CPUs (:mod:`tokenmill.raysession`) when none is running.
            verify: check each shard's sha256 against the manifest first (the driver
                hashes; workers only read).

        Raises:
            ShardVerifyError: the manifest or a shard (missing, truncated, sha256) is wrong,
                naming the first bad file.
            ValueError: a token id is outside the vocabulary (naming the shard).
        """
        opened = open_shards(manifest, split, verify=verify)
        keys, counts = count_shards(opened, ray_address=ray_address, num_cpus=num_cpus)
        return cls(opened.manifest.tokenizer, keys, counts)

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
        check_same(self.identity, table.identity, "legality table")
        ok = table.possible_pairs(self.prev, self.next)
        bad = np.flatnonzero(~ok)
        if limit is not None:
            bad = bad[:limit]
        enc = load_checked(self.identity, "the counted shards")
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
        """Read a file written by :meth:`save`."""
        with np.load(path) as z:
            ident = TokenizerIdentity(**json.loads(z["identity"].tobytes()))
            return cls(ident, z["keys"], z["counts"])


def _decode(enc, t: int) -> str:
    try:
        return enc.decode_single_token_bytes(t).decode("utf-8", "backslashreplace")
    except KeyError:
        return f"<id {t}>"
