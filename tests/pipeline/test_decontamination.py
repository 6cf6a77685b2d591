"""Decontamination against datatrove 0.10.1's ``NGramsDecontIndexer`` and
``NGramsDecontFilter`` (the reference), the eval-set index's reuse, and ``tokenmill run``.

The reference index is built by datatrove's own indexer from the same eval examples
(its lighteval registry, which it imports after reading the given examples, is stubbed
with an empty one); both decide on the same documents: the shared corpora and copies of
eval examples planted in other documents. The comparison over every document of the
shared corpora takes minutes with spaCy's tokenizer and is marked ``slow``; a sample runs
always.
"""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.pipeline.decont_data import ALL_CORPORA, corpus_texts, planted, qa_examples
from tokenmill.pipeline.decont.index import contains, ensure_index, index_key, load_index
from tokenmill.pipeline.decont.text import normalized_words, simplify_text
from tokenmill.pipeline.document.decontaminate import Decontaminate

N = 12
EVAL_CORPORA = ("wikipedia-wikitext-sample", "books-public-domain")


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _decont_cfg(path: Path, **rules) -> dict:
    es = {"name": "qa", "path": str(path), "answer_field": "answer",
          "prompt_field": "question", "id_field": "id"}
    return {"eval_sets": [es], "n": N, "query_ngrams": False, "overlap_ngrams": True} | rules


def _stub_lighteval(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty lighteval registry: datatrove's indexer then indexes only the examples
    it is given."""
    registry = types.SimpleNamespace(
        Registry=lambda **kw: types.SimpleNamespace(get_task_dict=lambda tasks: {}))
    task = types.SimpleNamespace(LightevalTask=types.SimpleNamespace(
        load_datasets=lambda tasks: None))
    for name, mod in (("lighteval", types.SimpleNamespace()),
                      ("lighteval.tasks", types.SimpleNamespace()),
                      ("lighteval.tasks.registry", registry),
                      ("lighteval.tasks.lighteval_task", task)):
        m = types.ModuleType(name)
        m.__dict__.update(vars(mod))
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, m)
    from datatrove.utils import _import_utils

    installed = _import_utils._is_distribution_available
    monkeypatch.setattr(_import_utils, "_is_distribution_available",
                        lambda name: name == "lighteval" or installed(name))


def _reference(monkeypatch: pytest.MonkeyPatch, examples: list[dict], folder: Path):
    """datatrove's filter over an index its indexer built from ``examples``."""
    pytest.importorskip("spacy", reason="datatrove's English word tokenizer needs spaCy")
    n_grams = pytest.importorskip("datatrove.pipeline.decont.n_grams",
                                  reason="dev extra: datatrove")
    import xxhash
    from datatrove.data import Document as DtDocument
    from datatrove.utils.hashes import xxhash as dt_xxhash

    # xxhash >= 4 hashes bytes only; datatrove 0.10.1 passes str (xxhash 3 took UTF-8)
    monkeypatch.setattr(dt_xxhash, "xxhash64", lambda d: xxhash.xxh64_intdigest(
        d.encode() if isinstance(d, str) else d))
    _stub_lighteval(monkeypatch)
    config = n_grams.NGramsDecontConfig(n_grams=N)
    indexer = n_grams.NGramsDecontIndexer(str(folder), lighteval_tasks=[], config=config)
    indexer.run([DtDocument(text=e["answer"], id=e["id"],
                            metadata={"query": e["question"], "task": "qa"})
                 for e in examples])
    flt = n_grams.NGramsDecontFilter(str(folder), config=config)

    def decide(key: str, text: str) -> str | None:
        doc = DtDocument(text=text, id=key)
        return None if flt.filter(doc) is True else doc.metadata["contaminated_ngram"]
    return decide


def _compare(monkeypatch, tmp_path: Path, train: list[tuple[str, str]],
             examples: list[dict]) -> int:
    """Assert tokenmill and datatrove remove the same documents for the same n-gram;
    the number removed."""
    evals = _write_jsonl(tmp_path / "evals.jsonl", examples)
    stage = Decontaminate(index=ensure_index(_decont_cfg(evals), None, tmp_path), n=N)
    ref = _reference(monkeypatch, examples, tmp_path / "dt-index")
    apart, removed = [], 0
    for key, text in train:
        ours = stage.match(text)
        theirs = ref(key, text)
        removed += ours is not None
        if (ours and ours[1]) != theirs:
            apart.append((key, ours, theirs))
    assert not apart, f"{len(apart)} of {len(train)} decided apart: {apart[:3]}"
    return removed


def _planted_docs(examples: list[dict]) -> list[tuple[str, str]]:
    hosts = [t for _, t in corpus_texts(("c4-en-sample",))[:50]]
    return [(f"planted/{i}/{v}", t) for i, (v, t) in enumerate(planted(examples, hosts, N))]


def test_normalized_words_follow_datatrove():
    text = "It's 3.14, Café — “cannot” go\tnow!! Dont\x01stop: 1,000 U.S. I'm"
    assert simplify_text(text) == "it s 0 cafe cannot go now dont stop 0 u s i m"
    assert normalized_words(text) == ["it", "s", "0", "cafe", "can", "not", "go", "now",
                                      "do", "nt", "stop", "0", "u", "s", "i", "m"]


def test_decisions_agree_with_datatrove_on_a_sample(monkeypatch, tmp_path):
    """40 examples from the wiki and book corpora; every 20th document of the web and wiki
    corpora and 8 planted copies of each example."""
    examples = qa_examples([t for _, t in corpus_texts(EVAL_CORPORA)][::25], 40)
    train = corpus_texts(("c4-en-sample", "wikipedia-wikitext-sample"))[::20]
    removed = _compare(monkeypatch, tmp_path, train + _planted_docs(examples), examples)
    assert removed >= 6 * len(examples)  # all but the too-short cuts


@pytest.mark.slow
def test_decisions_agree_with_datatrove_on_every_shared_document(monkeypatch, tmp_path):
    examples = qa_examples([t for _, t in corpus_texts(EVAL_CORPORA)][::5], 300)
    train = corpus_texts(ALL_CORPORA) + _planted_docs(examples)
    assert _compare(monkeypatch, tmp_path, train, examples) > 6 * len(examples)


def test_planted_variants_removed_or_kept_by_the_rules(tmp_path):
    examples = qa_examples([t for _, t in corpus_texts(("wikipedia-wikitext-sample",))], 5)
    evals = _write_jsonl(tmp_path / "evals.jsonl", examples)
    stage = Decontaminate(index=ensure_index(_decont_cfg(evals), None, tmp_path), n=N)
    hosts = ["The weather was fine and nobody said anything about it at all."] * 2
    got = {}
    for variant, text in planted(examples, hosts, N):
        got.setdefault(variant, set()).add(stage.match(text) is not None)
    assert got.pop("answer-n-1") == {False} and got.pop("overlap-short") == {False}
    assert all(v == {True} for v in got.values()), got


def test_index_is_content_addressed_and_reused(tmp_path):
    evals = _write_jsonl(tmp_path / "e.jsonl", [{"id": 1, "question": "q " * 20,
                                                 "answer": "an answer " * 10}])
    folder = Path(ensure_index(_decont_cfg(evals), None, tmp_path / "w"))
    stamp = (folder / "hashes.npy").stat().st_mtime_ns
    assert ensure_index(_decont_cfg(evals), None, tmp_path / "w") == str(folder)
    assert (folder / "hashes.npy").stat().st_mtime_ns == stamp
    assert index_key(_decont_cfg(evals, n=13), None) != folder.name
    _write_jsonl(evals, [{"id": 1, "question": "q " * 20, "answer": "another " * 10}])
    assert index_key(_decont_cfg(evals), None) != folder.name


def test_bad_eval_file_is_one_line(tmp_path):
    bad = tmp_path / "e.jsonl"
    bad.write_text('{"id": 1, "question": "q", "answer": "a"}\n{"id": 2}\n')
    with pytest.raises(ValueError, match=r"e.jsonl: row 1: no key 'answer'$"):
        ensure_index(_decont_cfg(bad), None, tmp_path)
    with pytest.raises(ValueError, match="not found"):
        ensure_index(_decont_cfg(tmp_path / "missing.jsonl"), None, tmp_path)


def _source(root: Path, texts: list[str]) -> None:
    (root / "web" / "data").mkdir(parents=True)
    (root / "web" / "README.md").write_text("---\nlicense: odc-by\n---\nplanted copies\n")
    _write_jsonl(root / "web" / "data" / "part.jsonl", [{"text": t} for t in texts])


@pytest.mark.slow
def test_tokenmill_run_quarantines_planted_documents(tmp_path):
    examples = qa_examples([t for _, t in corpus_texts(("wikipedia-wikitext-sample",))], 3)
    hosts = [t for _, t in corpus_texts(("c4-en-sample",))[:30]]
    plants = {5: f"{examples[0]['question']} {examples[0]['answer']}",
              9: examples[1]["answer"].upper(), 17: examples[2]["answer"]}
    _source(tmp_path, [f"{h} {plants.get(i, '')}" for i, h in enumerate(hosts)])
    _write_jsonl(tmp_path / "bench.jsonl", examples)
    (tmp_path / "mix.yaml").write_text(
        f"name: d\ndata_root: {tmp_path}\nlicenses: {{allow: [odc-by]}}\n"
        "sources: [{name: web, path: web}]\ndecontamination:\n  eval_sets:\n"
        "    - {name: bench, path: bench.jsonl, prompt_field: question, "
        "answer_field: answer, id_field: id}\n")
    cmd = [sys.executable, "-m", "tokenmill.cli", "run", str(tmp_path / "mix.yaml"), "-q",
           "-o", str(tmp_path / "o"), "--num-cpus", "1", "--data-root", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    index, = (tmp_path / "o" / "work" / "decont").iterdir()
    built = (index / "hashes.npy").stat().st_mtime_ns
    assert "contaminated:bench 3" in r.stdout
    q = pq.read_table(tmp_path / "o" / "quarantine" / "web.parquet").to_pylist()
    got = {row["key"]: json.loads(row["detail"]) for row in q if row["stage"] == "decontaminate"}
    assert {k.rsplit("#", 1)[1] for k in got} == {"000000005", "000000009", "000000017"}
    assert [d["example_id"] for _, d in sorted(got.items())] == ["ex-00000", "ex-00001",
                                                                 "ex-00002"]
    assert all(d["eval_set"] == "bench" and len(d["ngram"].split()) == N for d in got.values())
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    src, = manifest["sources"]
    assert src["counts"]["filtered"] == {"contaminated:bench": 3}
    assert src["stages"]["decontaminate"]["rejected"] == {"contaminated:bench": 3}
    # a rerun finds the index by content and writes the same manifest
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in (tmp_path / "o" / "work" / "decont").iterdir()] == [index.name]
    assert (index / "hashes.npy").stat().st_mtime_ns == built
    assert json.loads((tmp_path / "o" / "manifest.json").read_text()) == manifest


@pytest.mark.parametrize("size", [0, 1, 2, 3, 1000, 70_000])
def test_bucketed_lookup_finds_exactly_the_indexed_hashes(tmp_path, size):
    rng = np.random.default_rng(size)
    words = ["w" + "".join(chr(97 + int(c)) for c in str(i)) for i in range(size + N)]
    evals = _write_jsonl(tmp_path / "e.jsonl", [{"id": 0, "answer": " ".join(words)}])
    cfg = _decont_cfg(evals) | {"eval_sets": [{"name": "qa", "path": str(evals),
                                               "answer_field": "answer",
                                               "prompt_field": None, "id_field": None}]}
    hashes, owners, buckets = load_index(ensure_index(cfg, None, tmp_path))
    assert len(hashes) >= size + 1 and np.all(np.diff(hashes.astype(np.float64)) >= 0)
    query = np.concatenate([hashes[rng.permutation(len(hashes))[:50]],
                            rng.integers(0, 2**63, 200, dtype=np.uint64)])
    found = contains(hashes, buckets, query)
    expect = np.searchsorted(hashes, query)
    inside = (expect < len(hashes)) & (hashes[np.minimum(expect, len(hashes) - 1)] == query)
    assert np.array_equal(found, np.where(inside, expect, -1))
