"""Any tiktoken-format BPE: a ranks file, a split pattern and special tokens.

A tokenizer given as a table ``{name, ranks: PATH_OR_URL, pattern: REGEX,
special_tokens: {TEXT: ID}, eot: TEXT}`` (Llama 3's ``tokenizer.model`` is such a ranks
file: ``base64(token) rank`` per line) is loaded through tiktoken's public API
(``tiktoken.load.load_tiktoken_bpe``) into :class:`~tokenmill.tokenizers.tiktoken_parts.
EncodingParts`, from which ``tiktoken.Encoding`` is built.

Its identity is the sha256 of the three parts together
(:func:`~tokenmill.tokenizers.tiktoken_parts.bpe_identity_sha256`), so that the same ranks
split with another pattern, or with other special tokens, are another tokenizer.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import tiktoken
import tiktoken.load
from pydantic import BaseModel, ConfigDict, Field

from tokenmill.tokenizers.tiktoken_parts import (
    EncodingParts,
    bpe_identity_sha256,
    ranks_text_sha256,
)


class BpeFileSpec(BaseModel):
    """The ``tokenizer:`` table of a tiktoken-format BPE."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="a name for messages and file names")
    ranks: str = Field(min_length=1, description="ranks file (path or URL), tiktoken format")
    pattern: str = Field(min_length=1, description="the pre-tokenizer split regex")
    special_tokens: dict[str, int] = Field(default_factory=dict,
                                           description="special token text -> id")
    eot: str = Field(description="the special token that starts every document")


@dataclass(frozen=True)
class BpeFileTokenizer:
    """A loaded tiktoken-format BPE: its parts, ``identity_sha256`` (hex) and sizes."""

    parts: EncodingParts
    identity_sha256: str
    ranks_sha256: str
    n_vocab: int
    eot_token: int

    def encoding(self) -> tiktoken.Encoding:
        """``tiktoken.Encoding`` of the parts."""
        return self.parts.encoding()


_ENV_LOCK = threading.Lock()


def _load_ranks(src: str) -> dict[bytes, int]:
    """``load_tiktoken_bpe(src)``; a local file with tiktoken's cache off, so that it is
    read as it is now (tiktoken keys its cache by the path) and never copied into a cache
    folder that may be read-only."""
    if "://" in src:
        return tiktoken.load.load_tiktoken_bpe(src)
    with _ENV_LOCK:
        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken: "" disables its cache
        try:
            return tiktoken.load.load_tiktoken_bpe(src)
        finally:
            if saved is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved


def _check(spec: BpeFileSpec, ranks: dict[bytes, int]) -> None:
    if spec.eot not in spec.special_tokens:
        raise ValueError(f"tokenizer {spec.name}: eot {spec.eot!r} is not one of its "
                         f"special_tokens ({', '.join(map(repr, spec.special_tokens))})")
    taken = set(ranks.values())
    for text, i in spec.special_tokens.items():
        if i < 0 or i in taken:
            raise ValueError(f"tokenizer {spec.name}: special token {text!r} has id {i}, "
                             "which is negative or a ranks file token's")
    if len(set(spec.special_tokens.values())) != len(spec.special_tokens):
        raise ValueError(f"tokenizer {spec.name}: two special tokens share an id")


def load_bpe_file(spec: BpeFileSpec | dict, base_dir: str | os.PathLike | None = None
                  ) -> BpeFileTokenizer:
    """Load a tiktoken-format BPE (a relative ``ranks`` path is taken from ``base_dir``).

    Raises:
        ValueError: (one line naming the tokenizer) the table is invalid, the ranks file
            cannot be read or parsed, eot is not a special token, a special token's id is
            a ranks token's, or tiktoken refuses the pattern.
    """
    spec = spec if isinstance(spec, BpeFileSpec) else BpeFileSpec.model_validate(spec)
    src = spec.ranks
    if "://" not in src and base_dir is not None and not os.path.isabs(src):
        src = os.path.join(os.fspath(base_dir), src)
    try:
        ranks = _load_ranks(src)
    except (OSError, ValueError) as e:
        raise ValueError(f"tokenizer {spec.name}: cannot read ranks file {src} "
                         f"({type(e).__name__}: {e})") from None
    _check(spec, ranks)
    parts = EncodingParts(name=spec.name, pat_str=spec.pattern, mergeable_ranks=ranks,
                          special_tokens=dict(spec.special_tokens))
    try:
        enc = parts.encoding()
    except ValueError as e:
        raise ValueError(f"tokenizer {spec.name}: tiktoken refuses it ({e})") from None
    ranks_h = ranks_text_sha256(ranks)
    return BpeFileTokenizer(parts=parts, identity_sha256=bpe_identity_sha256(parts),
                            ranks_sha256=ranks_h, n_vocab=enc.n_vocab,
                            eot_token=spec.special_tokens[spec.eot])
