"""Token text is shown faithfully (case ../shared/cases/ngram-longest-fffd,
copied under tests/ngram/data): no U+FFFD for text that had none, byte-fragment tokens as
escaped bytes, a match starting inside a character says so, the query's pieces and the
leading-space form's count, and the split the index holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.manifests.mixdata import write_texts_curation
from tokenmill.cli import main
from tokenmill.ngram.commands import show_bytes

CASE = Path(__file__).parent / "data" / "ngram-longest-fffd"
QUERIES = ["我喜欢吃苹", "家族で東京", "🎉", "𝔘𝔫", "감사합", "鑫苹果和香", "Party time",
           "naïve café"]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    docs = [json.loads(line)["text"] for line in
            (CASE / "src" / "a.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(docs) == 15 and not any("\ufffd" in d for d in docs)
    out = tmp_path_factory.mktemp("fffd")
    texts = {"s": [(str(i), d) for i, d in enumerate(docs)]}
    manifest = write_texts_curation(out / "cur", "fffd", texts, val_every=10**6)
    assert main(["ngram", "build", str(manifest), "-o", str(out / "idx"), "-q",
                 "--counts"]) == 0
    return out / "idx"


def test_show_bytes():
    assert show_bytes(b"\xe6") == "'\\xe6'"
    assert show_bytes("苹".encode()) == "'苹'"
    assert show_bytes("苹".encode()[1:] + b" it's") == "'\\x8b\\xb9 it\\'s'"
    assert show_bytes(b"a\n") == "'a\\n'"


@pytest.mark.parametrize("cmd", ["longest", "count", "prob"])
def test_no_replacement_character(index, cmd, capsys):
    for q in QUERIES:
        assert main(["ngram", cmd, str(index), q] + (["-k", "3"] if cmd != "count" else [])) == 0
        out = capsys.readouterr().out
        assert "\ufffd" not in out, (q, out)
        assert "split train" in out and "pieces" in out
        if cmd != "prob":
            assert ("with a leading space" in out) == (not q.startswith(" "))


def test_longest_case(index, capsys):
    assert main(["ngram", "longest", str(index), "我喜欢吃苹", "-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "matched text  '我喜欢吃苹'" in out
    assert "'\\xe6'" in out  # the next token: a fragment of 果, as its byte
    assert "'\\xe8'(164) '\\x8b'(233) '\\xb9'(117)" in out  # pieces of 苹


def test_match_starting_inside_a_character_says_so(index, capsys):
    hits = 0
    for q in ["鑫苹果和香", "苏で東京", "辣がおい", "鑫家族"]:
        assert main(["ngram", "longest", str(index), q]) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("matched text"))
        inside = line.startswith("matched text  '\\x") and line[17] in "89ab"
        assert inside == ("starts inside a character" in line), line
        hits += inside
    assert hits >= 2
