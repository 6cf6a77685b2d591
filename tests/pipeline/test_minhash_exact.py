"""Fuzzy dedup removes a document only on an exact shingle-Jaccard check:
the exact shingle sets, the ``minhash-multicompare`` case, the bounded comparisons, the
``exact_check=False`` escape hatch and the global stage reading candidates' texts back."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tests.pipeline.cases.minhash_multicompare import documents
from tests.pipeline.dedup_oracle import BlockColumns, fuzzy_decide, fuzzy_dedup
from tests.shared import shared_data_path
from tokenmill.pipeline.dedup.fuzzy import MinHashDedup
from tokenmill.pipeline.dedup.minhash import (
    jaccard_detail,
    lsh_params,
    murmur64a,
    shingle_sets,
    shingles,
)
from tokenmill.pipeline.dedup.minhash.shingle_sets import SHINGLE_BASE64, sorted_jaccard
from tokenmill.pipeline.stage import Document

MASK64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def multicompare() -> tuple[list[str], list[str]]:
    texts = documents(3000)
    return [f"s/boiler.jsonl#{i:09d}" for i in range(len(texts))], texts


def _reference_set(text: str, ngram: int = 5) -> list[int]:
    """Sorted unique 64-bit shingle hashes from the pure-Python reference shingles."""
    out = set()
    for sh in shingles(text, ngram):
        h = 0
        for w in sh.split(b" "):
            h = (h * SHINGLE_BASE64 + murmur64a(w)) & MASK64
        out.add(h)
    return sorted(out)


def _true_jaccard(a: str, b: str, ngram: int = 5) -> float:
    sa, sb = set(shingles(a, ngram)), set(shingles(b, ngram))
    return len(sa & sb) / max(1, len(sa | sb))


def test_shingle_sets_equal_reference_and_jaccard_is_exact():
    rng = random.Random(0)
    words = ["a", "B", "ﬁne", "２x", "naïve", "e\u0301", "éé", "x" * 23, "日本語", "_", "--"]
    texts = ["", "  ", "one", "one two", "a b c d e a b c d e a b c d e",
             "Hello, World! ﬁne ２ Ünïcode", "\ud800 lone surrogate words here ok"]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60)))
              for _ in range(200)]
    values, offsets = shingle_sets(texts)
    assert values.dtype == np.uint64 and offsets.shape == (len(texts) + 1,)
    sets = [values[offsets[i]:offsets[i + 1]] for i in range(len(texts))]
    for t, s in zip(texts, sets, strict=True):
        assert s.tolist() == _reference_set(t), t
        assert len(s) == len(set(shingles(t)))  # no two shingles of a document collide
    for i in range(0, len(texts) - 1):
        j = sorted_jaccard(sets[i], sets[i + 1])
        assert j == pytest.approx(_true_jaccard(texts[i], texts[i + 1]) if len(sets[i]) or
                                  len(sets[i + 1]) else 0.0)
    with pytest.raises(ValueError, match="ngram"):
        shingle_sets(["a"], ngram=0)


def test_generator_copy_matches_the_case():
    """tests/pipeline/cases/minhash_multicompare.py reproduces the case's make_input.py."""
    case = shared_data_path().parent / "cases" / "minhash-multicompare" / "make_input.py"
    if not case.exists():
        pytest.skip(f"case not found at {case}")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "src").mkdir()
        subprocess.run([sys.executable, str(case)], cwd=tmp, check=True, timeout=120)
        lines = (Path(tmp) / "src" / "boiler.jsonl").read_text().splitlines()
    assert [json.loads(line)["text"] for line in lines] == documents(3000)


def test_multicompare_removes_nothing_in_linear_time(multicompare):
    """Every pair has true Jaccard 0.655: nothing is removed, though the estimate of
    hundreds of pairs reaches 0.8; each member is compared with a bounded number of kept
    documents (max_representatives + bands)."""
    keys, texts = multicompare
    res = fuzzy_dedup(keys, texts, threshold=0.8)
    print(res.counters)
    assert res.removed == {} and res.cluster_sizes == []
    assert res.counters["estimate_false_removals"] > 0  # the estimate alone would err
    bands, _ = lsh_params(0.8, 128)
    k = res.params["max_representatives"]
    assert res.counters["exact_checks"] <= len(texts) * (k + bands)
    small = fuzzy_dedup(keys, texts, threshold=0.8, max_representatives=4)
    assert small.removed == {}
    assert small.counters["exact_checks"] <= len(texts) * (4 + bands)
    assert small.counters["exact_checks"] < res.counters["exact_checks"]


def test_exact_check_off_restores_the_estimate_decision(multicompare):
    """``exact_check=False``: the former decision (removals on the estimate, compared with
    every kept document), which removes 90 documents of this case."""
    keys, texts = multicompare
    res = fuzzy_dedup(keys, texts, threshold=0.8, exact_check=False)
    assert len(res.removed) == 90
    assert "exact_check" not in res.params and "exact_checks" not in res.counters
    for k, (twin, j) in res.removed.items():
        assert j >= 0.8 and twin not in res.removed
        assert _true_jaccard(texts[keys.index(k)], texts[keys.index(twin)]) < 0.8


def test_near_duplicate_beyond_the_representatives_is_found(multicompare):
    """A giant LSH cluster of mutually dissimilar documents (the case) holds a true pair
    late in key order: X is far beyond the first max_representatives kept documents, yet
    X' is compared with it (X heads an LSH bucket X' shares) and removed, with the exact
    Jaccard recorded; the guarantee holds for every removal."""
    keys, texts = multicompare
    keys, texts = list(keys[:1200]), list(texts[:1200])
    x = texts[1000]
    words = x.split(" ")
    words[-3] = "zzzreplaced"
    x2 = " ".join(words)
    keys.append("s/boiler.jsonl#000001100x")  # after X (#...1000), between later documents
    texts.append(x2)
    res = fuzzy_dedup(keys, texts, threshold=0.8, max_representatives=8)
    print(res.counters)
    assert res.counters["candidate_clusters"] >= 1
    assert set(res.removed) == {"s/boiler.jsonl#000001100x"}
    twin, j = res.removed["s/boiler.jsonl#000001100x"]
    assert twin == keys[1000]
    assert j == pytest.approx(_true_jaccard(x, x2)) and j >= 0.8


def test_stage_detail_records_the_exact_value():
    base = " ".join(f"w{i}" for i in range(300))
    docs = [base, base.replace("w150", "v150"), base.replace("w7 ", "v7 ")]
    for exact in (True, False):
        res = fuzzy_dedup([f"c/{i}" for i in range(len(docs))], docs, exact_check=exact)
        assert sorted(res.removed) == ["c/1", "c/2"]
        for key, (twin, j) in res.removed.items():
            assert twin == "c/0"
            if exact:
                assert j == pytest.approx(_true_jaccard(docs[0], docs[int(key[-1])]))
                assert jaccard_detail(j, exact) == f"jaccard={j:.3f} (exact)"
            else:
                assert jaccard_detail(j, exact) == f"jaccard={j:.3f}"


def _view(blocks_docs: list[list[Document]], stage: MinHashDedup) -> BlockColumns:
    tables = []
    for docs in blocks_docs:
        cols = {"key": pa.array([d.key for d in docs], pa.string()),
                "text": pa.array([d.text for d in docs], pa.large_string())}
        cols.update(stage.block_columns(docs))
        tables.append(pa.table(cols))
    return BlockColumns(len(tables),
                        lambda i, c: tables[i].select(list(dict.fromkeys(["key", *c]))))


def test_global_stage_reads_candidates_from_blocks(multicompare):
    """MinHashDedup: the case spread over blocks (some documents already removed by exact
    dedup) removes nothing; a true near duplicate in another block is removed with the
    exact value; exact_check=False gives the former estimate-only removals."""
    keys, texts = multicompare
    x = texts[10] + " extra"
    docs = [Document(key=k, source="s", text=t) for k, t in zip(keys[:1500], texts,
                                                                strict=False)]
    docs.append(Document(key="t/near#0", source="t", text=x))
    blocks = [docs[i:i + 400] for i in range(0, len(docs), 400)]
    for exact in (True, False):
        stage = MinHashDedup(exact_check=exact)
        removals = [{} for _ in blocks]
        removals[0][keys[3]] = [keys[2], "exact_dedup", None]  # gathered without it
        rec = fuzzy_decide(stage.config, _view(blocks, stage), removals)
        fuzzy = {k: v for d in removals for k, v in d.items() if v[1] == "fuzzy_dedup"}
        if exact:
            j = _true_jaccard(texts[10], x)
            assert fuzzy == {"t/near#0": [keys[10], "fuzzy_dedup", f"jaccard={j:.3f} (exact)"]}
            assert rec["params"]["exact_check"] is True
        else:
            assert len(fuzzy) > 1 and all(not v[2].endswith("(exact)") for v in fuzzy.values())
