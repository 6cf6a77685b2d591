"""Edit records and their counts through ``tokenmill run`` when a document a stage cut
spans from is removed by a later stage: the counts (manifest, report, run summary) cover
the kept documents only, and the quarantine holds what rebuilds each original (its
removal row plus the edit records written before the text that row holds)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.pipeline.decont_data import corpus_texts, qa_examples
from tests.pipeline.substring_oracle import run_outputs, stage_input
from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.report.edits import rebuild
from tokenmill.tokenizers import get_encoding

REPO = Path(__file__).resolve().parents[2]
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega").split()


def _run(tmp_path: Path, datamix: str) -> tuple[subprocess.CompletedProcess, Path, dict,
                                                 list[dict], dict]:
    """``tokenmill run`` of the datamix text ``datamix`` into ``tmp_path / "o"`` (one CPU),
    which must succeed; returns the result, the output folder and its
    :func:`run_outputs` (manifest, quarantine rows, tokens by key)."""
    mix, out = tmp_path / "mix.yaml", tmp_path / "o"
    mix.write_text(datamix)
    cmd = [sys.executable, "-m", "tokenmill.cli", "run", str(mix), "-q", "-o", str(out),
           "--num-cpus", "1"]
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DATA_ROOT"}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return (r, out, *run_outputs(out))


def _edits(rows: list[dict], prefix: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["reason"].startswith(prefix):
            out[r["key"]].append(json.loads(r["detail"]) | {"text": r["text"]})
    return out


@pytest.mark.slow
def test_decontamination_cuts_of_documents_exact_dedup_removed(tmp_path):
    """Two documents cut to the same text (the second's copy in capitals): exact dedup
    removes the second. Its cuts stay in the quarantine (its removal row holds the cut
    text, so they rebuild the original) but no count holds them: the manifest, the
    report, the run summary."""
    hosts = [t for _, t in corpus_texts(("c4-en-sample",))[:6]]
    ex = qa_examples([t for _, t in corpus_texts(("wikipedia-wikitext-sample",))], 3)
    texts = [*hosts[:3], f"{hosts[3]} {ex[0]['answer']}", f"{hosts[3]} {ex[0]['answer'].upper()}",
             f"{hosts[4]} {ex[2]['answer']}", hosts[5]]
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "docs.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ex))
    r, out, manifest, rows, tokens = _run(
        tmp_path,
        f"name: d\ndata_root: {tmp_path}\ntokenizer: gpt2\nfilters: {{min_words: 5}}\n"
        "sources: [{name: web, path: web, license: cc0-1.0}]\ndecontamination:\n"
        "  eval_sets:\n    - {name: bench, path: bench.jsonl, prompt_field: question, "
        "answer_field: answer, id_field: id}\n  mode: cut\n  n: 8\n")
    key = "web/docs.jsonl#{:09d}".format
    removal = {x["key"]: x for x in rows if x["reason"] == "exact_dedup:duplicate"}
    assert set(removal) == {key(4)} and removal[key(4)]["duplicate_of"] == key(3)
    edits = _edits(rows, "decontaminate:edit:bench")
    assert set(edits) == {key(3), key(4), key(5)}
    # the removed document: its removal row (the cut text) plus its edit records
    original = rebuild(removal[key(4)]["text"], sorted(edits[key(4)], key=lambda d: d["start"]))
    assert original == normalize_text(texts[4])
    kept_spans = len(edits[key(3)]) + len(edits[key(5)])
    src, = manifest["sources"]
    assert src["decontamination_cuts"] == {"bench": kept_spans}
    assert f"decontaminate: {kept_spans} spans cut out of 2 kept documents" in r.stdout
    page = (out / "report.html").read_text()
    assert "2 kept documents lost spans; the first 2" in page
    assert "decontaminate:edit:bench</b>: " in page and " removed" not in page.split(
        "decontaminate:edit:bench</b>: ")[1].split("<")[0]
    assert set(tokens) == {key(i) for i in range(7)} - {key(4)}


def _notice_corpus(root: Path) -> list[str]:
    """A passage, a later document repeating half of it (cut by substring dedup) and a
    short three-sentence run from another document (cut by span dedup), which leaves it
    too short: span dedup removes it."""
    rng = random.Random(3)

    def sentences(k: int) -> list[str]:
        return [" ".join(rng.choices(WORDS, k=9)).capitalize() + "." for _ in range(k)]

    short = "It rained. We stayed. Then we left."
    passage = sentences(8)
    texts = [" ".join(passage), " ".join(sentences(8)) + " " + short,
             " ".join(passage[:4]) + " " + short + " Short tail here.",
             " ".join(sentences(8)) + "\n" + " ".join(passage[4:]),
             " ".join(sentences(8))]
    (root / "a").mkdir(parents=True)
    (root / "a" / "docs.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts))
    return texts


@pytest.mark.slow
def test_substring_cuts_of_a_document_span_dedup_removed(tmp_path):
    """Substring dedup cuts a span, span dedup then removes the document: the removal
    row holds the prepared text (the original for the global stages), so the cut is not
    an edit record, and the manifest's counters and the run summary leave it out; every
    edit record rebuilds its kept document, and none is only whitespace."""
    _notice_corpus(tmp_path / "data")
    r, out, manifest, rows, tokens = _run(
        tmp_path,
        f"name: s\ntokenizer: gpt2\ndata_root: {tmp_path / 'data'}\n"
        "filters: {min_words: 5}\nsources: [{name: a, path: a, license: cc0-1.0}]\n"
        "substring_dedup: {min_tokens: 20, scope: all}\n"
        "span_dedup: {mode: sentences, min_doc_words: 20}\n")
    texts = dict(stage_input(out, ["a"], set()))
    removed = {x["key"]: x for x in rows if x["reason"] == "span_dedup:removed"}
    gone = "a/docs.jsonl#000000002"
    assert set(removed) == {gone} and removed[gone]["text"] == texts[gone]
    assert "after cutting" in removed[gone]["detail"]
    cuts: dict[str, list[dict]] = defaultdict(list)
    for stage in ("substring_dedup", "span_dedup"):
        recs = _edits(rows, f"{stage}:edit:")
        assert gone not in recs
        rec = manifest[stage]
        assert rec["spans"] == sum(len(v) for v in recs.values()) > 0, stage
        assert rec["documents_edited"] == len(recs), stage
        assert rec["by_source"]["a"]["spans"] == rec["spans"]
        assert (f"{stage}: {rec['spans']} spans cut out of {len(recs)} kept documents"
                in r.stdout)
        for key, v in recs.items():
            cuts[key] += v
    for key, recs in cuts.items():
        assert all(c["text"].strip() for c in recs), key
        recs.sort(key=lambda c: c["start"])
        kept = get_encoding("gpt2").decode(tokens[key].tolist())
        assert rebuild(kept, recs) == texts[key], key
    assert pq.read_table(out / "quarantine" / "a.parquet").num_rows == len(rows)
