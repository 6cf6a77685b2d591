"""Decontamination through ``tokenmill run``: eval sets read from a URL (a loopback HTTP
server) and from a Hub dataset at a pinned commit (the loopback Hub of
:mod:`tests.pipeline.fake_hub`), and the cut mode, whose kept documents plus their edit
records give back the original text."""

from __future__ import annotations

import functools
import http.server
import io
import json
import socket
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline.decont_data import corpus_texts, qa_examples
from tests.pipeline.fake_hub import FakeRepo, fake_hub, hub_env
from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import iter_documents
from tokenmill.pipeline.decont.index import ensure_index
from tokenmill.pipeline.decont.text import simplify_text, word_spans
from tokenmill.pipeline.document.decontaminate import Decontaminate
from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.report.curation_report import decontamination_rows
from tokenmill.pipeline.stage import Document
from tokenmill.tokenizers import get_encoding

N = 12
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "tokenmill-test/evals"


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def examples() -> list[dict]:
    return qa_examples([t for _, t in corpus_texts(("wikipedia-wikitext-sample",))], 4)


@pytest.fixture(scope="module")
def hosts() -> list[str]:
    return [t for _, t in corpus_texts(("c4-en-sample",))[:12]]


def _source(root: Path, texts: list[str]) -> None:
    (root / "web" / "data").mkdir(parents=True)
    (root / "web" / "README.md").write_text("---\nlicense: odc-by\n---\nplanted copies\n")
    (root / "web" / "data" / "part.jsonl").write_text(_jsonl([{"text": t} for t in texts]))


def _run(root: Path, eval_sets: str, out: str = "o", extra: str = "",
         env: dict | None = None) -> subprocess.CompletedProcess:
    (root / f"{out}.yaml").write_text(
        f"name: d\ndata_root: {root}\nlicenses: {{allow: [odc-by]}}\ntokenizer: gpt2\n"
        f"sources: [{{name: web, path: web}}]\n{extra}decontamination:\n"
        f"  eval_sets:\n{eval_sets}")
    cmd = [sys.executable, "-m", "tokenmill.cli", "run", str(root / f"{out}.yaml"), "-q",
           "--no-report", "-o", str(root / out), "--num-cpus", "1", "--data-root", str(root)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _quarantine(out: Path) -> list[dict]:
    return pq.read_table(out / "quarantine" / "web.parquet").to_pylist()


@contextmanager
def _http(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``folder`` on 127.0.0.1; yields the base URL and the request log."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):  # noqa: ANN001 (the log the test reads)
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()




def _parquet(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


@contextmanager
def _remote_evals(tmp_path: Path, examples: list[dict], hosts: list[str]
                  ) -> Iterator[tuple[str, str, list[str], FakeRepo, dict[str, str]]]:
    """A source with planted copies; example 0 served over HTTP, examples 1-2 by the Hub
    (split test of the default config; split train holds example 3). Yields the eval
    sets' YAML, the HTTP base URL and request log, the Hub repository and the env."""
    plants = {2: examples[0]["answer"], 5: examples[1]["answer"].upper(),
              8: f"{examples[2]['question']} {examples[2]['answer']}",
              10: examples[3]["answer"]}
    _source(tmp_path, [f"{h} {plants.get(i, '')}" for i, h in enumerate(hosts)])
    served = tmp_path / "served"
    served.mkdir()
    (served / "bench.jsonl").write_text(_jsonl(examples[:1]))
    repo = FakeRepo(REPO_ID, COMMIT, {
        "README.md": b"---\nlicense: mit\n---\n",
        "data/test-00000-of-00001.parquet": _parquet(examples[1:3]),
        "data/train-00000-of-00001.parquet": _parquet(examples[3:])})
    fields = "prompt_field: question, answer_field: answer, id_field: id"
    with _http(served) as (base, requests), fake_hub(repo) as endpoint:
        sets = (f"    - {{name: web-bench, path: '{base}/bench.jsonl', {fields}}}\n"
                f"    - {{name: hub-bench, hub: '{REPO_ID}@{COMMIT}', split: test, {fields}}}\n")
        yield sets, base, requests, repo, hub_env(tmp_path, endpoint)


def _one_line_error(r: subprocess.CompletedProcess, names: str) -> None:
    assert r.returncode == 2 and names in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_eval_sets_from_a_url_and_a_pinned_hub_commit(tmp_path, examples, hosts):
    """Each planted copy is removed for its eval set (the Hub's train split is never
    read); a URL that cannot be read is one line naming it."""
    with _remote_evals(tmp_path, examples, hosts) as (sets, base, _, repo, env):
        r = _run(tmp_path, sets, env=env)
        assert r.returncode == 0, r.stderr
        q = {row["key"].rsplit("#", 1)[1]: (row["reason"], json.loads(row["detail"]))
             for row in _quarantine(tmp_path / "o") if row["stage"] == "decontaminate"}
        assert {k: (why, d["example_id"]) for k, (why, d) in q.items()} == {
            "000000002": ("contaminated:web-bench", "ex-00000"),
            "000000005": ("contaminated:hub-bench", "ex-00001"),
            "000000008": ("contaminated:hub-bench", "ex-00002")}
        src, = json.loads((tmp_path / "o" / "manifest.json").read_text())["sources"]
        assert src["counts"]["filtered"] == {"contaminated:hub-bench": 2,
                                             "contaminated:web-bench": 1}
        assert list((tmp_path / "o" / "work" / "downloads").rglob("bench.jsonl"))
        assert not any("train-" in p for _, p in repo.requests)
        bad = _run(tmp_path, f"    - {{name: b, path: '{base}/gone.jsonl'}}\n", out="bad",
                   env=env)
        _one_line_error(bad, f"{base}/gone.jsonl")


@pytest.mark.slow
def test_a_rerun_reads_no_eval_set_again(tmp_path, examples, hosts):
    """The index is found by content: a rerun asks neither server for anything and writes
    the same manifest; a split the Hub dataset lacks is one line naming it."""
    with _remote_evals(tmp_path, examples, hosts) as (sets, _, requests, repo, env):
        assert _run(tmp_path, sets, env=env).returncode == 0
        manifest = (tmp_path / "o" / "manifest.json").read_text()
        seen = (len(requests), len(repo.requests))
        again = _run(tmp_path, sets, env=env)
        assert again.returncode == 0, again.stderr
        assert (len(requests), len(repo.requests)) == seen
        assert (tmp_path / "o" / "manifest.json").read_text() == manifest
        bad = _run(tmp_path, f"    - {{name: b, hub: '{REPO_ID}@{COMMIT}', split: dev}}\n",
                   out="bad", env=env)
        _one_line_error(bad, "'dev'")


def _rebuilt(kept: str, edits: list[dict]) -> str:
    """The text before the decontamination stage: ``kept`` with each cut put back."""
    out, at, pos = [], 0, 0  # at: offset in kept; pos: in the text before
    for d in sorted(edits, key=lambda d: d["start"]):
        out += [kept[at:at + d["start"] - pos], d["text"]]
        at, pos = at + d["start"] - pos, d["end"]
    return "".join(out) + kept[at:]


@pytest.mark.slow
def test_cut_mode_keeps_the_rest_and_records_each_cut(tmp_path, examples, hosts):
    """Planted copies are cut out of their documents; each kept document plus its edit
    records is its text before the stage, holds no eval n-gram any more and decodes from
    the shards; a document the cut leaves below min_words is removed with that reason."""
    tiny = f"Note: {examples[2]['answer']}"
    plants = {1: f"{examples[0]['question']} {examples[0]['answer']}",
              4: f"{examples[1]['answer'].upper()} and again: {examples[1]['answer']}",
              7: f"{examples[3]['answer']} {examples[0]['answer']}"}
    texts = [f"{h} {plants.get(i, '')}".strip() for i, h in enumerate(hosts)] + [tiny]
    _source(tmp_path, texts)
    (tmp_path / "bench.jsonl").write_text(_jsonl(examples))
    r = _run(tmp_path, "    - {name: bench, path: bench.jsonl, prompt_field: question, "
             "answer_field: answer, id_field: id}\n  mode: cut\n",
             extra="filters: {min_words: 5}\n")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "o"
    edits, removed = defaultdict(list), {}
    for row in _quarantine(out):
        if row["reason"].startswith("decontaminate:edit:"):
            d = json.loads(row["detail"])
            assert row["reason"] == f"decontaminate:edit:{d['eval_set']}" and \
                len(d["ngram"].split()) == N and d["replacement"] == ""
            edits[row["key"]].append(d | {"text": row["text"]})
        elif row["stage"] == "decontaminate":
            removed[row["key"]] = row["reason"]
    assert [k.rsplit("#", 1)[1] for k in removed] == [f"{len(hosts):09d}"]
    assert list(removed.values()) == ["contaminated:bench:too_few_words"]
    assert sorted(k.rsplit("#", 1)[1] for k in edits) == ["000000001", "000000004",
                                                          "000000007"]
    enc = get_encoding("gpt2")
    src, = json.loads((out / "manifest.json").read_text())["sources"]
    kept = {k: enc.decode(t[1:].tolist()) for sh in src["shards"]
            for k, t in iter_documents(out / sh["path"])}
    by_key = {f"web/data/part.jsonl#{i:09d}": normalize_text(t) for i, t in enumerate(texts)}
    stage = Decontaminate(index=str(next((out / "work" / "decont").iterdir())), n=N)
    for key, cuts in edits.items():
        assert _rebuilt(kept[key], cuts) == by_key[key], key
        assert stage.match(kept[key]) is None, key
        assert hosts[int(key[-9:])][:200] in kept[key]  # the host text stays
    assert all(kept[k] == by_key[k] for k in kept if k not in edits)
    cuts = sum(len(v) for v in edits.values())
    assert cuts >= 4 and src["decontamination_cuts"] == {"bench": cuts}
    assert src["counts"]["filtered"] == {"contaminated:bench:too_few_words": 1}
    assert decontamination_rows(load_manifest(out)) == [["web", "bench", 1, cuts]]
    rep = subprocess.run([sys.executable, "-m", "tokenmill.cli", "report", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr
    page = (out / "report.html").read_text()
    assert "Decontamination per eval set" in page and "decontaminate:edit:bench" in page


def test_cut_spans_cover_the_matched_words_and_merge(tmp_path, examples):
    """The stage alone: a copy with case, punctuation and spacing changes is cut from its
    first to its last matched word; copies side by side make one cut; the words of
    numbers and contractions map back to their characters."""
    evals = tmp_path / "e.jsonl"
    evals.write_text(_jsonl(examples))
    es = {"name": "qa", "path": str(evals), "answer_field": "answer",
          "prompt_field": "question", "id_field": "id"}
    index = ensure_index({"eval_sets": [es], "n": N, "query_ngrams": False,
                          "overlap_ngrams": True}, None, tmp_path)
    stage = Decontaminate(index=index, n=N, mode="cut")
    q, answer = examples[0]["question"], examples[0]["answer"]
    loud = "  ".join(w.upper() + "," for w in answer.split())
    for text, pieces in ((f"Before. {loud} After.", 1), (f"Start {q} {answer} end", 1),
                         (f"A {answer} b c d e f g h i j k l m n o {answer} z", 2)):
        cuts = stage.cut(text)
        assert len(cuts) == pieces, (text, cuts)
        left, at = "", 0
        for s, e, d in cuts:
            assert d["eval_set"] == "qa" and d["example_id"] == "ex-00000"
            left, at = left + text[at:s], e
        assert stage.match(left + text[at:]) is None and stage.match(text) is not None
    words, spans = word_spans("I can't pay 3.14 cannot")
    assert [("I can't pay 3.14 cannot")[s:e] for s, e in spans] == [
        "I", "can", "t", "pay", "3.14", "can", "not"] and words[4] == "0"
    docs = list(stage([Document("k", "s", f"Intro words here. {answer} Outro words.")]))
    assert docs[0].text.startswith("Intro words here. ") and \
        docs[0].text.endswith(" Outro words.") and len(docs[0].text) < 40
    assert stage.extra == {"qa": 1}


def test_every_word_is_placed_on_the_characters_it_comes_from():
    """On the naughty strings (scripts, marks, controls, numbers, odd whitespace) every
    normalized word gets a span whose own simplified text holds it."""
    texts = [t for _, t in corpus_texts(("naughty-strings",))]
    assert texts
    for text in texts:
        words, spans = word_spans(text)
        assert all(w in simplify_text(text[s:e]) for w, (s, e) in zip(words, spans,
                                                                       strict=True)), text


def test_an_unreachable_eval_set_url_is_one_line_naming_why(tmp_path, hosts):
    """A host that refuses the connection is named as such (not "not found"); the eval
    sets are read before Ray starts, so this takes no cluster start."""
    _source(tmp_path, hosts[:2])
    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/bench.jsonl"
    r = _run(tmp_path, f"    - {{name: bench, path: '{url}'}}\n")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and url in line and "Cannot connect" in line, line


@pytest.mark.parametrize("rows, why", [
    ("", "no examples"),
    ('{"answer": "far too short to match"}\n', "none of its 1 examples has 12 words"),
])
def test_an_eval_set_that_can_match_nothing_is_refused(tmp_path, hosts, rows, why):
    """An empty eval set, or one whose every example is shorter than n words, would make
    the stage a silent no-op: the run stops in one line naming the set."""
    _source(tmp_path, hosts[:2])
    (tmp_path / "ev.jsonl").write_text(rows)
    r = _run(tmp_path, "    - {name: ev, path: ev.jsonl}\n")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.endswith(why + ", so none can match (decontamination.n)"
                                              if "none" in why else why), line
    assert "eval set ev (ev.jsonl)" in line
