"""ObservedPairs on Ray over a real small datamix: exact counts, and the soundness check."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import read_tokens
from tokenmill.tokenizers import TokenizerMismatchError, identity
from tokenmill.tokenizers.legality import LegalityTable
from tokenmill.tokenizers.observed import ObservedPairs


@pytest.fixture(scope="module")
def observed(small_datamix):
    return ObservedPairs.from_manifest(small_datamix, num_cpus=2)


def test_counts_are_exact(observed, small_datamix):
    man = load_manifest(small_datamix)
    streams = [np.asarray(read_tokens(small_datamix / s.path)) for s in man.shards()]
    brute = Counter()
    for t in streams:
        brute.update(zip(t[:-1].tolist(), t[1:].tolist(), strict=True))
    assert observed.total() == sum(brute.values()) == sum(len(t) - 1 for t in streams)
    assert len(observed) == len(brute)
    for (a, b), c in list(brute.items())[:2000]:
        assert observed.count(a, b) == c
    local = ObservedPairs.from_tokens(man.tokenizer, streams)
    np.testing.assert_array_equal(local.keys, observed.keys)
    np.testing.assert_array_equal(local.counts, observed.counts)
    val = ObservedPairs.from_manifest(small_datamix, split="val")
    assert 0 < val.total() < observed.total()
    eot = man.tokenizer.eot_token
    assert observed.top(1)[0][2] >= observed.count(eot, 464)


def test_observed_pairs_are_all_possible(observed, gpt2_table):
    assert observed.check(gpt2_table) == []


def test_check_reports_a_wrongly_masked_pair_decoded(observed, gpt2_table):
    a, b, c = observed.top(1)[0]
    packed = np.array(gpt2_table.packed)  # writable copy
    packed[a, b >> 3] &= np.uint8(~(1 << (b & 7)) & 0xFF)
    broken = LegalityTable(gpt2_table.identity, packed, {})
    bad = observed.check(broken)
    assert len(bad) == 1 and (bad[0].prev, bad[0].next, bad[0].count) == (a, b, c)
    assert "marked impossible" in str(bad[0]) and repr(bad[0].next_text) in str(bad[0])
    other = LegalityTable(identity("cl100k_base"), np.zeros((1, 1), np.uint8), {})
    with pytest.raises(TokenizerMismatchError, match="cl100k_base"):
        observed.check(other)


def test_save_load_and_bad_shard(observed, small_datamix, tmp_path):
    p = observed.save(tmp_path / "pairs.npz")
    back = ObservedPairs.load(p)
    np.testing.assert_array_equal(back.keys, observed.keys)
    assert back.identity == observed.identity
    import shutil

    copy = tmp_path / "dm"
    shutil.copytree(small_datamix, copy)
    man = load_manifest(copy)
    shard = copy / man.shards()[0].path
    raw = bytearray(shard.read_bytes())
    raw[-2:] = b"\x01\x02"
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256"):
        ObservedPairs.from_manifest(copy)
