"""ObservedPairs (ngram's order-2 counting) on Ray over a real small datamix: exact counts,
shards opened through the verified path, the soundness check and ``tokenmill ngram pairs``."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import read_tokens
from tokenmill.manifests.verify import ShardVerifyError
from tokenmill.ngram.observed import ObservedPairs
from tokenmill.tokenizers import TokenizerMismatchError, identity
from tokenmill.tokenizers.legality import LegalityTable


@pytest.fixture(scope="module", autouse=True)
def one_ray():
    """One embedded Ray for the module: every count below joins it."""
    from tokenmill.raysession import ray_session

    with ray_session(num_cpus=2):
        yield


@pytest.fixture(scope="module")
def observed(small_datamix):
    return ObservedPairs.from_manifest(small_datamix, num_cpus=2)


@pytest.fixture(scope="module")
def gpt2_table(observed):
    """The gpt2 table's rows for every observed previous token (a partial build: the full
    table is built once per session by tests/tokenizers)."""
    return LegalityTable.build("gpt2", rows=np.unique(observed.prev))


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
    row = int(np.searchsorted(gpt2_table.rows, a))
    packed[row, b >> 3] &= np.uint8(~(1 << (b & 7)) & 0xFF)
    broken = LegalityTable(gpt2_table.identity, packed, {}, gpt2_table.rows)
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
    with pytest.raises(ShardVerifyError, match=rf"{shard.name}: sha256 .* differs"):
        ObservedPairs.from_manifest(copy)
    assert ObservedPairs.from_manifest(copy, verify=False).total() == observed.total()


def test_cli_pairs_runs_the_legality_check(small_datamix, gpt2_table, observed, monkeypatch,
                                           tmp_path, capsys):
    from tokenmill.cli import main

    # a partial table cannot be saved: the command's load returns it instead
    monkeypatch.setattr(LegalityTable, "load",
                        classmethod(lambda cls, path, encoding=None: gpt2_table))
    assert main(["ngram", "pairs", str(small_datamix), "--table", str(tmp_path / "t"),
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "legality check  0 observed pair(s) marked impossible" in out
    assert f"{observed.total():,} ({len(observed):,} distinct)" in out
    assert re.search(r"adjacent pairs  [\d,]+ \([\d,]+ distinct\)", out)
