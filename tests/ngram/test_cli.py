"""``tokenmill ngram build/count/longest`` end to end on the quickstart shards."""

from __future__ import annotations

import re

from tokenmill.cli import main
from tokenmill.ngram.index import SuffixArrayIndex
from tokenmill.tokenizers import get_encoding


def test_cli_build_count_longest(quickstart, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["ngram", "build", str(quickstart), "-o", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "bytes/token" in text and re.search(r"build time\s+[\d.]+ s", text)
    index = SuffixArrayIndex(out)
    enc = get_encoding("gpt2")

    phrase = " of the United States"
    assert main(["ngram", "count", str(out), phrase]) == 0
    text = capsys.readouterr().out
    want = index.count(enc.encode_ordinary(phrase))
    assert want > 0 and f"count   {want}" in text

    query = "zqxj unseen prefix and then the United States of"
    assert main(["ngram", "longest", str(out), query, "-k", "3"]) == 0
    text = capsys.readouterr().out
    m = index.longest_match(enc.encode_ordinary(query), k=3)
    assert 0 < m.length < len(enc.encode_ordinary(query))
    assert f"match length  {m.length} of" in text
    matched = enc.decode(enc.encode_ordinary(query)[-m.length:])
    assert repr(matched) in text
    assert repr(enc.decode([int(m.next_tokens[0])])) in text


def test_cli_bad_options_fail_before_any_work(quickstart, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["ngram", "build", str(quickstart), "-o", str(out), "-q", "--counts",
                 "--orders", "x"]) == 2
    assert "--orders 'x'" in capsys.readouterr().err
    assert not out.exists()  # refused before the index was built
