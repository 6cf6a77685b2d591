"""Soundness of the legality tables against tiktoken itself: every adjacent pair of every real
corpus is possible, and sampled impossible pairs never appear in adversarial contexts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tokenizers.legality_adversarial import adversarial_violations, sample_impossible
from tests.tokenizers.rowcheck import check_rows_against_reference, token_id
from tokenmill.tokenizers import get_encoding
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks


def _corpus_violations(table, pairs, docs):
    prev, nxt, owner = pairs
    ok = table.possible_pairs(prev, nxt)
    bad = np.flatnonzero(~ok)
    return [(int(prev[i]), int(nxt[i]), docs[owner[i]][0]) for i in bad[:20]], len(prev)


def test_gpt2_every_corpus_pair_is_possible(gpt2_table, gpt2_corpus_pairs, corpus_docs):
    bad, n = _corpus_violations(gpt2_table, gpt2_corpus_pairs, corpus_docs)
    assert n > 10_000_000
    assert bad == [], [gpt2_table.explain(a, b) + f" in {key}" for a, b, key in bad]


@pytest.mark.slow  # cl100k-encodes every corpus; gpt2's pairs are checked in the fast suite
def test_cl100k_every_corpus_pair_is_possible(cl100k_table, cl100k_corpus_pairs, corpus_docs):
    """Every adjacent token pair of every shared corpus, encoded with cl100k_base (over ten
    million), is possible in the cl100k table."""
    bad, n = _corpus_violations(cl100k_table, cl100k_corpus_pairs, corpus_docs)
    assert n > 10_000_000
    assert bad == [], [cl100k_table.explain(a, b) + f" in {key}" for a, b, key in bad]


def _adversarial(table, name, rows=None):
    enc = get_encoding(name)
    rng = np.random.default_rng(11)
    pairs = np.unique(sample_impossible(table, 140_000, rng, rows=rows), axis=0)
    violations, n_texts, unreal = adversarial_violations(enc, table, pairs, rng,
                                                         contexts_per_pair=8)
    tested = n_texts // 9  # each tested pair: the bare junction + 8 contexts
    print(f"{name}: {len(pairs):,} impossible pairs, {unreal:,} not realisable in valid UTF-8 "
          f"(trivially impossible), {tested:,} tested in {n_texts:,} texts")
    assert tested >= 100_000
    assert violations == [], [(table.explain(a, b), t) for a, b, t in violations[:10]]


@pytest.mark.slow  # 140,000 pairs in contexts; the detector: test_adversarial_detector_*
def test_gpt2_adversarial_contexts(gpt2_table):
    _adversarial(gpt2_table, "gpt2")


@pytest.mark.slow  # on the corpus-row cl100k table; gpt2's contexts: the fast suite
def test_cl100k_adversarial_contexts(cl100k_table):
    """Impossible pairs sampled from the cl100k table's rows never appear when their
    junction is placed in adversarial contexts and encoded by tiktoken."""
    _adversarial(cl100k_table, "cl100k_base", rows=cl100k_table.rows)


def test_adversarial_detector_catches_possible_pairs(gpt2_table):
    """The detector itself works: pairs that are possible are found in some context."""
    enc = get_encoding("gpt2")
    r = mergeable_ranks(enc)
    pairs = np.array([[r[b"Hyper"], r[b"param"]], [r[b" the"], r[b" cat"]],
                      [r[b"\n"], r[b"\n"]], [r[b"\xe2\x80"], r[b"\x9c"]]])
    violations, _, unreal = adversarial_violations(enc, gpt2_table, pairs,
                                                   np.random.default_rng(0))
    assert unreal == 0
    assert {(a, b) for a, b, _ in violations} == {tuple(p) for p in pairs.tolist()}


# characters and pieces where the regexes branch: contraction letters in both cases, long s,
# digits (ASCII and not), apostrophes, every kind of white space, combining marks, title case,
# case changes inside words (o200k), '/' after newlines (o200k), emoji, and a special token's
# text (ordinary text for encode_ordinary)
_FUZZ_ALPHABET = list("aAbBsSdDmMtTlLvVeErRxXyz019'’.,;:!?-/*()\"") + [
    " ", " ", "  ", "\n", "\r\n", "\r", "\t", "\xa0", "\u3000", "\u2009", "\x85", "\x0b", "é",
    "É", "ſ", "ß", "中", "文", "ا", "١", "٣", "²", "Ⅻ", "ǅ", "ʰ", "\u0301", "\u0915", "\u093f",
    "\u094d", "🙂", "€", "—", "…", "'s", "'S", "'ll", "'LL", "'re", "'ve", "n't", "N'T", "123",
    "4567", "\n/", "/*", "*/", "Hello", "WORLD", "camelCase", "ÀÉ", "ﬁ", "İ", "<|endoftext|>"]


def _fuzz_pairs(name: str, n: int = 50_000):
    enc = get_encoding(name)
    rng = np.random.default_rng(5)
    pieces = np.array(_FUZZ_ALPHABET, dtype=object)
    encode = enc.encode_ordinary
    prev, nxt = [], []
    for _ in range(n):
        ids = encode("".join(rng.choice(pieces, size=rng.integers(1, 14))))
        prev.extend(ids[:-1])
        nxt.extend(ids[1:])
    return np.asarray(prev, np.int64), np.asarray(nxt, np.int64)


def test_fuzzed_texts_gpt2(gpt2_table):
    prev, nxt = _fuzz_pairs("gpt2")
    bad = np.flatnonzero(~gpt2_table.possible_pairs(prev, nxt))
    assert len(bad) == 0, [gpt2_table.explain(int(prev[i]), int(nxt[i])) for i in bad[:10]]


# o200k_base adds adversarial contexts on its rows: slow, in `.ci/run`
@pytest.mark.parametrize("name", ["cl100k_base",
                                  pytest.param("o200k_base", marks=pytest.mark.slow)])
def test_fuzzed_texts(name):
    from tokenmill.tokenizers.legality import LegalityTable

    prev, nxt = _fuzz_pairs(name)
    table = LegalityTable.build(name, rows=np.unique(prev))
    assert table.meta["model"] == name.split("_")[0]
    bad = np.flatnonzero(~table.possible_pairs(prev, nxt))
    assert len(bad) == 0, [table.explain(int(prev[i]), int(nxt[i])) for i in bad[:10]]
    if name == "o200k_base":  # o200k_base adversarial contexts on the fuzz rows (bonus)
        rng = np.random.default_rng(12)
        pairs = np.unique(sample_impossible(table, 30_000, rng, rows=table.rows), axis=0)
        violations, n_texts, _ = adversarial_violations(get_encoding(name), table, pairs, rng)
        assert n_texts > 150_000
        assert violations == [], [(table.explain(a, b), t) for a, b, t in violations[:10]]


def test_cl100k_rows_match_plain_python_reference():
    """Rows of a cl100k_base table (two random ones and four common tokens', built for those
    rows alone) equal the plain-Python reference."""
    from tokenmill.tokenizers.legality import LegalityTable

    enc = get_encoding("cl100k_base")
    rng = np.random.default_rng(4)
    rows = [int(r) for r in rng.choice(len(mergeable_ranks(enc)), 2, replace=False)]
    rows += [token_id(enc, b) for b in (b" ", b"12", b".\n", b"'s")]
    table = LegalityTable.build("cl100k_base", rows=np.unique(rows))
    check_rows_against_reference(table, "cl100k_base", rows)


@pytest.fixture(scope="module")
def renumbered_table(tmp_path_factory):
    """The full legality table of a tokenizer given as a ``tokenizer:`` table (GPT-2's
    ranks with other byte ids, :mod:`tests.tokenizers.tokenizer_files`), built through
    ``tokenmill legality build tokenizer.yaml``, and the tokenizer loaded here."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.tokenizers.tokenizer_files import write_renumbered
    from tokenmill.tokenizers import load_tokenizer
    from tokenmill.tokenizers.legality import LegalityTable

    folder = tmp_path_factory.mktemp("renumbered")
    table = write_renumbered(folder)
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "legality", "build",
                        str(folder / "tokenizer.yaml"), "-o", str(folder / "tables"), "-q"],
                       capture_output=True, text=True, timeout=3000, cwd=repo)
    assert r.returncode == 0, r.stderr
    name = load_tokenizer(table, folder).name
    return name, LegalityTable.load(folder / "tables", encoding=name)


@pytest.mark.slow
def test_table_tokenizer_every_corpus_pair_is_possible(renumbered_table, corpus_docs):
    from tests.tokenizers.conftest import _encode_pairs

    name, table = renumbered_table
    assert table.meta["model"] == "r50k"
    bad, n = _corpus_violations(table, _encode_pairs(name, corpus_docs), corpus_docs)
    assert n > 10_000_000
    assert bad == [], [table.explain(a, b) + f" in {key}" for a, b, key in bad]


@pytest.mark.slow
def test_table_tokenizer_adversarial_contexts_and_fuzzed_texts(renumbered_table):
    name, table = renumbered_table
    _adversarial(table, name)
    prev, nxt = _fuzz_pairs(name)
    bad = np.flatnonzero(~table.possible_pairs(prev, nxt))
    assert len(bad) == 0, [table.explain(int(prev[i]), int(nxt[i])) for i in bad[:10]]
