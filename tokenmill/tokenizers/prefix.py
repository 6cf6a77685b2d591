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

import json
import os
from pathlib import Path

import numpy as np
import tiktoken

from tokenmill.atomic import atomic_open
from tokenmill.tokenizers.identities import TokenizerIdentity
from tokenmill.tokenizers.registry import check_same, get_encoding, identity
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks

#: File name suffix of a saved map: ``<encoding>.prefix.npz``.
PREFIX_SUFFIX = ".prefix.npz"


def token_bytes_table(enc: tiktoken.Encoding) -> list[bytes | None]:
    """``table[id]`` = the bytes of mergeable token ``id``; None for special or unused ids."""
    table: list[bytes | None] = [None] * enc.n_vocab
    for b, r in mergeable_ranks(enc).items():
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
        return cls.of_encoding(get_encoding(encoding) if isinstance(encoding, str) else encoding)

    @classmethod
    def of_encoding(cls, enc: tiktoken.Encoding) -> PrefixMap:
        """:meth:`build` for an encoding already loaded (say by
        :func:`tokenmill.tokenizers.load_checked`)."""
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

    def save(self, path: str | os.PathLike) -> Path:
        """Write the map atomically to ``path`` (a file, or a folder that gets
        ``<encoding>.prefix.npz``): ``parent`` (``int32[n_vocab]``, -1 = no prefix, the
        speedrun's ``prefix_table`` convention) and the tokenizer identity as JSON."""
        p = Path(path)
        if p.is_dir() or p.suffix == "":
            p = p / f"{self.name}{PREFIX_SUFFIX}"
        ident = json.dumps(identity(self.name).model_dump(), sort_keys=True)
        with atomic_open(p) as f:
            np.savez(f, parent=np.asarray(self.parent, dtype=np.int32), identity=np.array(ident))
        return p

    @classmethod
    def load(cls, path: str | os.PathLike, encoding: str | None = None) -> PrefixMap:
        """Read a map written by :meth:`save` (a file, or the folder holding
        ``<encoding>.prefix.npz``).

        Raises:
            FileNotFoundError: no saved map there.
            ValueError: not a prefix map, or ids outside its vocabulary (naming the file).
            TokenizerMismatchError: the map was saved for another tokenizer than ``encoding``.
        """
        p = Path(path)
        if p.is_dir():
            cands = sorted(p.glob(f"{encoding or '*'}{PREFIX_SUFFIX}"))
            if not cands:
                raise FileNotFoundError(f"no *{PREFIX_SUFFIX} file in {p}")
            p = cands[0]
        try:
            with np.load(p, allow_pickle=False) as z:
                parent = np.asarray(z["parent"], dtype=np.int32)
                ident = TokenizerIdentity(**json.loads(str(z["identity"])))
        except FileNotFoundError:
            raise
        except Exception as e:  # not an npz, or one without our arrays
            raise ValueError(f"{p}: not a saved prefix map ({e})") from None
        if len(parent) != ident.n_vocab or parent.max(initial=-1) >= ident.n_vocab:
            raise ValueError(f"{p}: {len(parent)} entries, expected {ident.n_vocab} ids of "
                             f"{ident.short()}")
        if encoding is not None:
            check_same(identity(encoding), ident, f"prefix map {p}")
        return cls(ident.name, parent)

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
