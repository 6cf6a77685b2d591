"""The arguments of tiktoken's ``Encoding``, kept by tokenmill instead of read back from it.

tiktoken exposes an encoding's mergeable ranks, split pattern and special tokens only as
private attributes. tokenmill needs them (the tokenizer identity, the legality tables, the
prefix map), so it keeps them itself, through tiktoken's public API only:

* ranks: ``tiktoken.load.load_tiktoken_bpe`` (``r50k_base``, ``cl100k_base``,
  ``o200k_base``) or ``tiktoken.load.data_gym_to_mergeable_bpe_ranks`` (``gpt2``), from the
  same addresses and with the same sha256 as tiktoken (:data:`tokenmill.tokenizers.fetch.FILES`),
  read from tiktoken's cache (``TIKTOKEN_CACHE_DIR``);
* split patterns: :mod:`tokenmill.tokenizers.legality_regex` (the patterns its legality
  model is written for); special tokens and sizes: below.

:meth:`EncodingParts.encoding` builds ``tiktoken.Encoding(**parts)``; a test checks that it
encodes real corpora exactly as ``tiktoken.get_encoding`` does, so the two cannot drift.

The parts' identity (:func:`bpe_identity_sha256`, version :data:`BPE_IDENTITY_VERSION`) is
the sha256 of the three parts together: the ranks in ``.tiktoken`` text form sorted by rank
(:func:`ranks_text_sha256`), then the pattern, then the special tokens sorted by id.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass

import tiktoken
import tiktoken.load

from tokenmill.tokenizers.fetch import FILES
from tokenmill.tokenizers.legality_regex import CL100K_PAT, O200K_PAT, R50K_PAT

BPE_IDENTITY_VERSION = 2  # version 1: a built-in encoding's name and ranks sha256
_ENDOFTEXT = "<|endoftext|>"
_PATTERNS = {"gpt2": R50K_PAT, "r50k_base": R50K_PAT, "cl100k_base": CL100K_PAT,
             "o200k_base": O200K_PAT}
_SPECIAL_TOKENS = {
    "gpt2": {_ENDOFTEXT: 50256},
    "r50k_base": {_ENDOFTEXT: 50256},
    "cl100k_base": {_ENDOFTEXT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                    "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
    "o200k_base": {_ENDOFTEXT: 199999, "<|endofprompt|>": 200018},
}
_EXPLICIT_N_VOCAB = {"gpt2": 50257, "r50k_base": 50257}


@dataclass(frozen=True)
class EncodingParts:
    """What ``tiktoken.Encoding`` is built from: ``mergeable_ranks`` (token bytes -> id),
    the split regex ``pat_str``, ``special_tokens`` (text -> id), ``explicit_n_vocab``."""

    name: str
    pat_str: str
    mergeable_ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    explicit_n_vocab: int | None = None

    def encoding(self) -> tiktoken.Encoding:
        """``tiktoken.Encoding`` built from these parts."""
        return tiktoken.Encoding(self.name, pat_str=self.pat_str,
                                 mergeable_ranks=self.mergeable_ranks,
                                 special_tokens=self.special_tokens,
                                 explicit_n_vocab=self.explicit_n_vocab)


def _ranks_lines(ranks: dict[bytes, int]):
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        yield base64.b64encode(token) + b" " + str(rank).encode() + b"\n"


def ranks_text_sha256(ranks: dict[bytes, int]) -> str:
    """sha256 (hex) of ranks in ``.tiktoken`` text form sorted by rank (the identity's
    ``ranks_sha256``)."""
    return hashlib.sha256(b"".join(_ranks_lines(ranks))).hexdigest()


def bpe_identity_sha256(parts: EncodingParts) -> str:
    """sha256 (hex) of ranks, pattern and special tokens together (module docstring)."""
    h = hashlib.sha256(f"tokenmill-bpe-identity {BPE_IDENTITY_VERSION}\n".encode())
    for line in _ranks_lines(parts.mergeable_ranks):
        h.update(line)
    h.update(b"pattern " + base64.b64encode(parts.pat_str.encode("utf-8")) + b"\n")
    for text, i in sorted(parts.special_tokens.items(), key=lambda kv: kv[1]):
        h.update(b"special " + base64.b64encode(text.encode("utf-8")) + b" "
                 + str(i).encode() + b"\n")
    return h.hexdigest()


def _load_ranks(name: str) -> dict[bytes, int]:
    files = FILES[name]
    try:
        if name == "gpt2":
            vocab, encoder = files
            return tiktoken.load.data_gym_to_mergeable_bpe_ranks(
                vocab_bpe_file=vocab.url, encoder_json_file=encoder.url,
                vocab_bpe_hash=vocab.sha256, encoder_json_hash=encoder.sha256)
        return tiktoken.load.load_tiktoken_bpe(files[0].url, expected_hash=files[0].sha256)
    except Exception as e:  # network or cache failure inside tiktoken
        raise RuntimeError(
            f"could not load the ranks of tiktoken encoding {name!r} ({type(e).__name__}: "
            f"{e}). Fill the cache with `tokenmill tokenizer fetch {name}` and set "
            "TIKTOKEN_CACHE_DIR.") from e


@functools.lru_cache(maxsize=8)
def encoding_parts(name: str) -> EncodingParts:
    """The :class:`EncodingParts` of built-in encoding ``name`` (cached).

    Raises:
        ValueError: not one of ``gpt2``, ``r50k_base``, ``cl100k_base``, ``o200k_base``.
        RuntimeError: the ranks files are not in tiktoken's cache and cannot be fetched
            (names ``tokenmill tokenizer fetch``).
    """
    if name not in _PATTERNS:
        raise ValueError(f"unknown tokenizer encoding {name!r}; known: {', '.join(_PATTERNS)}")
    return EncodingParts(name=name, pat_str=_PATTERNS[name], mergeable_ranks=_load_ranks(name),
                         special_tokens=dict(_SPECIAL_TOKENS[name]),
                         explicit_n_vocab=_EXPLICIT_N_VOCAB.get(name))


_REGISTERED: dict[str, EncodingParts] = {}


def register_parts(parts: EncodingParts) -> None:
    """Make a tokenizer that is not built in (:mod:`tokenmill.tokenizers.bpe_file`) known by
    its name to :func:`mergeable_ranks`, :func:`special_tokens` and :func:`split_pattern`.

    Raises:
        ValueError: the name is a built-in encoding's, or another tokenizer's already.
    """
    if parts.name in _PATTERNS:
        raise ValueError(f"tokenizer name {parts.name!r} is a built-in encoding's")
    known = _REGISTERED.get(parts.name)
    if known is not None and known != parts:
        raise ValueError(f"another tokenizer is already named {parts.name!r}")
    _REGISTERED[parts.name] = parts


def _parts(enc: tiktoken.Encoding | str) -> EncodingParts:
    name = enc if isinstance(enc, str) else enc.name
    return _REGISTERED.get(name) or encoding_parts(name)


def mergeable_ranks(enc: tiktoken.Encoding | str) -> dict[bytes, int]:
    """Token bytes -> id of an encoding (or its name); callers must not mutate it."""
    return _parts(enc).mergeable_ranks


def special_tokens(enc: tiktoken.Encoding | str) -> dict[str, int]:
    """Special token text -> id of an encoding (or its name)."""
    return _parts(enc).special_tokens


def split_pattern(enc: tiktoken.Encoding | str) -> str:
    """The split regex of an encoding (or its name)."""
    return _parts(enc).pat_str
