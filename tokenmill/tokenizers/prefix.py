"""Longest-token-prefix map of a tiktoken vocabulary.

For token ``t``, ``prefix(t)`` is the token whose bytes are the longest *proper* prefix of
``t``'s bytes, or -1 when there is none (single bytes, special tokens, unused ids). Following
the map gives the full chain, e.g. GPT-2 `` bananas`` -> `` banana`` -> `` ban`` -> `` b``
-> `` ``. The NanoGPT speedrun records use it for an auxiliary loss that gives partial credit
for predicting a prefix of the target token.

Construction: sort the vocabulary's byte strings; every prefix of ``t`` sorts before ``t``,
so one pass with a stack of "open" ancestors finds the longest token prefix of each token in
O(V log V) (the sort) plus O(V) stack work.
"""

from __future__ import annotations

import numpy as np
import tiktoken

from tokenmill.tokenizers import get_encoding


def token_bytes_table(enc: tiktoken.Encoding) -> list[bytes | None]:
    """``table[id]`` = the bytes of mergeable token ``id``; None for special or unused ids."""
    table: list[bytes | None] = [None] * enc.n_vocab
    for b, r in enc._mergeable_ranks.items():
        table[r] = b
    return table


class PrefixMap:
    """Longest proper token prefix of every token of a tiktoken encoding.

    Attributes:
        name: encoding name.
        parent: ``np.ndarray[int32]`` of length ``n_vocab``; ``parent[t]`` is the id of the
            longest proper prefix token of ``t`` or -1.
    """

    def __init__(self, name: str, parent: np.ndarray) -> None:
        self.name = name
        self.parent = parent

    @classmethod
    def build(cls, encoding: str | tiktoken.Encoding) -> PrefixMap:
        """Build the map for an encoding (name or ``tiktoken.Encoding``); about 0.1 s for GPT-2."""
        enc = get_encoding(encoding) if isinstance(encoding, str) else encoding
        table = token_bytes_table(enc)
        parent = np.full(enc.n_vocab, -1, dtype=np.int32)
        order = sorted((b, i) for i, b in enumerate(table) if b is not None)
        stack: list[tuple[bytes, int]] = []
        for b, i in order:
            while stack and not b.startswith(stack[-1][0]):
                stack.pop()
            if stack:
                parent[i] = stack[-1][1]
            stack.append((b, i))
        return cls(enc.name, parent)

    def prefix(self, t: int) -> int:
        """Id of the longest proper prefix token of ``t``, or -1.

        Raises:
            IndexError: ``t`` is not an id of this vocabulary.
        """
        if not 0 <= t < len(self.parent):
            raise IndexError(f"token id {t} outside vocabulary of {self.name} ({len(self.parent)})")
        return int(self.parent[t])

    def chain(self, t: int) -> list[int]:
        """``[t, prefix(t), prefix(prefix(t)), ...]`` down to the shortest token prefix."""
        out = [int(t)]
        p = self.prefix(t)
        while p >= 0:
            out.append(p)
            p = int(self.parent[p])
        return out

    def depth(self) -> np.ndarray:
        """``int32[n_vocab]``: length of each token's chain minus one (0 for chain roots)."""
        depth = np.zeros(len(self.parent), dtype=np.int32)
        # parents are strictly shorter, so process in order of byte length via repeated passes
        cur = self.parent.copy()
        while True:
            live = cur >= 0
            if not live.any():
                return depth
            depth += live
            cur = np.where(live, self.parent[np.maximum(cur, 0)], -1)
