"""A tiktoken-format BPE given as a ranks file + pattern + special tokens (made in the test)."""

from __future__ import annotations

import base64

import pytest

from tokenmill.tokenizers import get_encoding
from tokenmill.tokenizers.bpe_file import load_bpe_file
from tokenmill.tokenizers.legality_regex import CL100K_PAT, R50K_PAT
from tokenmill.tokenizers.tiktoken_parts import encoding_parts


@pytest.fixture(scope="module")
def ranks_file(tmp_path_factory):
    """GPT-2's ranks written in tiktoken's format: ``base64(token) rank`` per line."""
    path = tmp_path_factory.mktemp("bpe") / "gpt2.tiktoken"
    ranks = sorted(encoding_parts("gpt2").mergeable_ranks.items(), key=lambda kv: kv[1])
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))
    return path


def _spec(ranks_file, **kw):
    return {"name": "mine", "ranks": str(ranks_file), "pattern": R50K_PAT,
            "special_tokens": {"<|endoftext|>": 50256}, "eot": "<|endoftext|>", **kw}


def test_a_ranks_file_encodes_as_the_encoding_it_came_from(ranks_file, corpus_docs):
    tok = load_bpe_file(_spec(ranks_file))
    assert (tok.n_vocab, tok.eot_token) == (50257, 50256)
    texts = [t for _, t in corpus_docs[::11]]
    assert tok.encoding().encode_ordinary_batch(texts, num_threads=2) == get_encoding(
        "gpt2").encode_ordinary_batch(texts, num_threads=2)


def test_identity_is_ranks_pattern_and_special_tokens_together(ranks_file, tmp_path):
    base = load_bpe_file(_spec(ranks_file))
    copy = tmp_path / "elsewhere.tiktoken"
    copy.write_bytes(ranks_file.read_bytes())
    assert load_bpe_file(_spec(copy)).identity_sha256 == base.identity_sha256
    other_pattern = load_bpe_file(_spec(ranks_file, pattern=CL100K_PAT))
    other_special = load_bpe_file(_spec(ranks_file, special_tokens={
        "<|endoftext|>": 50256, "<|pad|>": 50257}))
    assert len({base.identity_sha256, other_pattern.identity_sha256,
                other_special.identity_sha256}) == 3
    assert other_pattern.ranks_sha256 == base.ranks_sha256


def test_a_changed_local_file_is_read_again(ranks_file, tmp_path):
    path = tmp_path / "r.tiktoken"
    path.write_bytes(ranks_file.read_bytes())
    first = load_bpe_file(_spec(path)).identity_sha256
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # one rank fewer
    assert load_bpe_file(_spec(path, special_tokens={"<|endoftext|>": 50255})
                         ).identity_sha256 != first


@pytest.mark.parametrize("change, message", [
    ({"eot": "<|eot|>"}, "eot '<|eot|>' is not one of its special_tokens"),
    ({"special_tokens": {"<|endoftext|>": 100}}, "has id 100, which is negative or a ranks"),
    ({"ranks": "/nonexistent/ranks.tiktoken"}, "cannot read ranks file /nonexistent"),
])
def test_bad_tables_are_refused_in_one_line(ranks_file, change, message):
    with pytest.raises(ValueError, match=message) as e:
        load_bpe_file(_spec(ranks_file, **change))
    assert "\n" not in str(e.value)


def test_a_registered_bpe_file_serves_the_tables_by_name(ranks_file):
    from tokenmill.tokenizers.prefix import token_bytes_table
    from tokenmill.tokenizers.tiktoken_parts import (
        mergeable_ranks,
        register_parts,
        special_tokens,
        split_pattern,
    )

    tok = load_bpe_file(_spec(ranks_file, name="mine-registered"))
    register_parts(tok.parts)
    register_parts(tok.parts)  # the same parts again: fine
    enc = tok.encoding()
    assert mergeable_ranks(enc) is tok.parts.mergeable_ranks
    assert special_tokens(enc) == {"<|endoftext|>": 50256} and split_pattern(enc) == R50K_PAT
    assert token_bytes_table(enc)[50256] is None and token_bytes_table(enc)[0] == b"!"
    with pytest.raises(ValueError, match="built-in encoding"):
        register_parts(load_bpe_file(_spec(ranks_file, name="gpt2")).parts)
