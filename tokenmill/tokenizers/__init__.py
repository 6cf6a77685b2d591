"""Tokenizers: tiktoken encodings with a content identity.

A tokenizer is a built-in tiktoken encoding named by ``tokenizer: NAME`` (``gpt2``,
``r50k_base``, ``cl100k_base``, ``o200k_base``), any tiktoken-format BPE given as a table
(:mod:`~tokenmill.tokenizers.bpe_file`) or a Hugging Face byte-level BPE ``tokenizer.json``
(:mod:`~tokenmill.tokenizers.hf_json`). Its identity (:mod:`~tokenmill.tokenizers.identities`)
is recorded in every shard set and manifest, so that tables, indices and trainers can refuse
data made with another tokenizer (:mod:`~tokenmill.tokenizers.registry`: the tokenizers
loaded in this process and the checks between identities).
"""

from tokenmill.tokenizers.arguments import tokenizer_label
from tokenmill.tokenizers.identities import (
    IDENTITY_VERSION,
    SUPPORTED_ENCODINGS,
    TokenizerIdentity,
    TokenizerMismatchError,
    TokenizerSource,
)
from tokenmill.tokenizers.registry import (
    as_identity,
    check_identity,
    check_installed,
    check_same,
    get_encoding,
    identity,
    load_checked,
    load_tokenizer,
    ranks_sha256,
    same_tokenizer,
)

__all__ = ["IDENTITY_VERSION", "SUPPORTED_ENCODINGS", "TokenizerIdentity",
           "TokenizerMismatchError", "TokenizerSource", "as_identity", "check_identity",
           "check_installed", "check_same", "get_encoding", "identity", "load_checked",
           "load_tokenizer", "ranks_sha256", "same_tokenizer", "tokenizer_label"]
