"""tokenmill keeps tiktoken's Encoding arguments itself (public API only); they are exactly
the encodings tiktoken gives, and no tokenmill module reads tiktoken's private attributes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokenmill.tokenizers import SUPPORTED_ENCODINGS, get_encoding
from tokenmill.tokenizers.tiktoken_parts import encoding_parts

REPO = Path(__file__).resolve().parents[2]
PRIVATE = re.compile(r"\._(mergeable_ranks|pat_str|special_tokens|core_bpe)\b")


@pytest.mark.parametrize("name", SUPPORTED_ENCODINGS)
def test_kept_parts_are_tiktokens_encoding(name, corpus_docs):
    parts, enc = encoding_parts(name), get_encoding(name)
    ours = parts.encoding()
    assert ours.n_vocab == enc.n_vocab and ours.eot_token == enc.eot_token
    for token, rank in parts.mergeable_ranks.items():
        assert enc.decode_single_token_bytes(rank) == token
    assert enc.special_tokens_set == set(parts.special_tokens)
    for text, i in parts.special_tokens.items():
        assert enc.encode_single_token(text) == i
    # the split pattern: the same ids on every 7th document of every shared corpus
    texts = [t for _, t in corpus_docs[::7]]
    assert ours.encode_ordinary_batch(texts, num_threads=2) == enc.encode_ordinary_batch(
        texts, num_threads=2)


def test_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match="unknown tokenizer encoding 'p50k_edit'"):
        encoding_parts("p50k_edit")


def test_no_module_reads_tiktoken_private_attributes():
    for folder in ("tokenmill", "tests", "benchmarks"):
        for p in sorted((REPO / folder).rglob("*.py")):
            text = p.read_text(encoding="utf-8")
            if p.name == "test_tiktoken_parts.py":
                continue
            assert not PRIVATE.search(text), f"{p} reads {PRIVATE.search(text).group()}"
