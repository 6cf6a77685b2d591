"""Longest-token-prefix map: GPT-2 examples and a brute-force check over whole vocabularies."""

from __future__ import annotations

import numpy as np
import pytest

from tests.shared import shared_data
from tokenmill.tokenizers import get_encoding
from tokenmill.tokenizers.prefix import PrefixMap
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks


def _brute_force(enc) -> np.ndarray:
    ranks = mergeable_ranks(enc)
    parent = np.full(enc.n_vocab, -1, dtype=np.int32)
    for b, t in ranks.items():
        for k in range(len(b) - 1, 0, -1):  # every proper prefix, longest first
            p = ranks.get(b[:k])
            if p is not None:
                parent[t] = p
                break
    return parent


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base"])
def test_prefix_map_agrees_with_brute_force(name):
    shared_data("tiktoken")
    enc = get_encoding(name)
    pm = PrefixMap.build(enc)
    assert pm.parent.dtype == np.int32 and pm.parent.shape == (enc.n_vocab,)
    np.testing.assert_array_equal(pm.parent, _brute_force(enc))


def test_gpt2_bananas_chain_and_roots():
    shared_data("tiktoken")
    enc = get_encoding("gpt2")
    pm = PrefixMap.build("gpt2")
    r = mergeable_ranks(enc)
    assert pm.prefix(r[b" bananas"]) == r[b" banana"]
    assert [enc.decode_single_token_bytes(t) for t in pm.chain(r[b" bananas"])] == [
        b" bananas", b" banana", b" ban", b" ba", b" b", b" "]
    for i in range(256):
        assert pm.prefix(r[bytes([i])]) == -1
    assert pm.prefix(enc.eot_token) == -1
    assert pm.chain(enc.eot_token) == [enc.eot_token]
    # every chain strictly shortens the bytes and ends at a root
    depth = pm.depth()
    t = r[b" bananas"]
    assert depth[t] == 5 and depth[r[b" "]] == 0
    with pytest.raises(IndexError, match="outside vocabulary"):
        pm.prefix(enc.n_vocab)
