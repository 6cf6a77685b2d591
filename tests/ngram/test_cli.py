"""``tokenmill ngram build/count/longest/prob`` end to end on a small datamix."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tokenmill.cli import main
from tokenmill.ngram.counts import NGramCountsModel
from tokenmill.ngram.index import SuffixArrayIndex
from tokenmill.tokenizers import get_encoding


def test_cli_build_count_longest_prob(small_datamix, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["ngram", "build", str(small_datamix), "-o", str(out), "-q", "--counts"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"build time\s+[\d.]+ s", text)
    index_mib = float(re.search(r"index size\s+([\d.]+) MiB \([\d.]+ bytes/token\)", text)[1])
    m = re.search(r"counts size\s+([\d.]+) MiB \(([\d.]+) bytes/token, ([\d.]+)x the index\)",
                  text)
    assert m and float(m[3]) <= 8, text
    on_disk = sum(f.stat().st_size for f in (out / "counts").iterdir()) / 2**20
    assert abs(float(m[1]) - on_disk) < 0.1 and index_mib > 0
    index = SuffixArrayIndex(out)
    enc = get_encoding("gpt2")

    phrase = " of the United States"
    assert main(["ngram", "count", str(out), phrase]) == 0
    text = capsys.readouterr().out
    want = index.count(enc.encode_ordinary(phrase))
    assert want > 0 and f"count         {want:,}" in text
    assert "split train" in text and "' United'(1578)" in text
    assert "with a leading space" not in text  # the query has one
    assert main(["ngram", "count", str(out), "United States"]) == 0
    text = capsys.readouterr().out
    sp = index.count(enc.encode_ordinary(" United States"))
    assert f"with a leading space ' United States': count {sp:,}" in text

    query = "zqxj unseen prefix and then the United States of"
    assert main(["ngram", "longest", str(out), query, "-k", "3"]) == 0
    text = capsys.readouterr().out
    m = index.longest_match(enc.encode_ordinary(query), k=3)
    assert 0 < m.length < len(enc.encode_ordinary(query))
    assert f"match length  {m.length} of" in text
    matched = enc.decode(enc.encode_ordinary(query)[-m.length:])
    assert repr(matched) in text
    assert repr(enc.decode([int(m.next_tokens[0])])) in text

    assert main(["ngram", "prob", str(out), " of the United", "-k", "3"]) == 0
    text = capsys.readouterr().out
    model = NGramCountsModel.load(out / "counts")
    ids, probs = model.next_tokens(enc.encode_ordinary(" of the United"), k=3)
    assert enc.decode([int(ids[0])]) in (" States", " Kingdom", " Nations")
    assert (np.diff(probs) <= 0).all()
    rows = re.findall(r"^\s+([\d.]+)\s+(\d+)\s+'", text, re.M)
    assert [int(t) for _, t in rows] == ids.tolist()
    np.testing.assert_allclose([float(p) for p, _ in rows], probs, atol=1e-4)


@pytest.mark.parametrize("orders", ["x", "2-99", "1-3"])
def test_cli_bad_options_fail_before_any_work(quickstart, tmp_path, capsys, orders):
    out = tmp_path / "idx"
    assert main(["ngram", "build", str(quickstart), "-o", str(out), "-q", "--counts",
                 "--orders", orders]) == 2
    assert f"--orders {orders!r}" in capsys.readouterr().err
    assert not out.exists()  # refused before the index was built


def test_cli_prob_without_counts_says_how_to_build(small_datamix, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["ngram", "build", str(small_datamix), "-o", str(out), "-q", "--no-verify"]) == 0
    assert "shard verification is off (--no-verify)" in capsys.readouterr().err
    assert main(["ngram", "prob", str(out), "the"]) == 2
    assert "--counts" in capsys.readouterr().err
