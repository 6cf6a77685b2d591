"""A tokenizer's identity: the record every shard set, manifest, table and index keeps of
the tokenizer that made its token ids.

Its identity (:class:`TokenizerIdentity`, version 2) is the sha256 of its ranks, split
pattern and special tokens together (:func:`~tokenmill.tokenizers.tiktoken_parts.
bpe_identity_sha256`), with the sha256 of the ranks alone (tiktoken's ``.tiktoken`` form:
``base64(token) rank`` per line, sorted by rank) and, for a tokenizer that is not built in,
where its files are (``source``). Version 1 (a built-in encoding's name and ranks sha256,
written before version 2) is still read. Two identities are compared by
:func:`tokenmill.tokenizers.registry.same_tokenizer`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SUPPORTED_ENCODINGS = ("gpt2", "r50k_base", "cl100k_base", "o200k_base")
IDENTITY_VERSION = 2


class TokenizerSource(BaseModel):
    """Where the files of a tokenizer that is not built in are, and the parts not in them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: str | None = Field(
        default=None, description="tiktoken-format ranks file (absolute path or URL)")
    tokenizer_json: str | None = Field(
        default=None, description="Hugging Face tokenizer.json converted to the ranks "
        "(absolute path or URL)")
    pattern: str = Field(description="the pre-tokenizer split regex")
    special_tokens: dict[str, int] = Field(description="special token text -> id")
    eot: str = Field(description="the special token that starts every document")


class TokenizerIdentity(BaseModel):
    """Identity + sizes of a tokenizer. Compare two with :func:`same_tokenizer`."""

    model_config = ConfigDict(frozen=True)

    version: int = Field(
        default=1, description="identity version: 2 = identity_sha256 of ranks, pattern and "
        "special tokens; 1 (written before version 2, absent field) = a built-in encoding's "
        "name and ranks_sha256")
    name: str = Field(description="tiktoken encoding name (gpt2, r50k_base, cl100k_base, "
                      "o200k_base) or the name of a tokenizer given as a table")
    ranks_sha256: str = Field(description="sha256 of the BPE ranks in .tiktoken text form")
    identity_sha256: str | None = Field(
        default=None, description="version 2: sha256 of ranks, pattern and special tokens")
    n_vocab: int = Field(description="number of token ids (the largest id + 1)")
    eot_token: int = Field(description="the end-of-text id that starts every document")
    source: TokenizerSource | None = Field(
        default=None, description="a tokenizer that is not built in: its ranks file or "
        "tokenizer.json, pattern, special tokens and eot (null: the built-in encoding name)")

    def short(self) -> str:
        return f"{self.name}@{(self.identity_sha256 or self.ranks_sha256)[:12]}"


class TokenizerMismatchError(ValueError):
    """Data or a table made with one tokenizer was used with another."""
