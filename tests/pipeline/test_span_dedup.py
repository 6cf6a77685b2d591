"""Sentence-span and paragraph dedup (``span_dedup`` in a datamix): the rules on hand-made
documents, agreement with datatrove 0.10.1's three ``SentenceDedup`` steps (signature,
finder, filter) on the shared corpora, and ``tokenmill run`` with the stage on.

Classes of difference from datatrove, and why:

* *Edges*: datatrove joins the kept units and strips the result's start, drops what
  follows the last sentence (a space at most) of a changed document, and in paragraph
  mode its final ``\\n``; tokenmill cuts only the repeated units (with the whitespace
  that joined them, and after a cut at the start the whitespace datatrove strips), so a
  changed document's own leading whitespace and final space or ``\\n`` stay. The
  comparison strips both texts; the minimums are judged on datatrove's form of the text.
* *Sentence boundaries*: tokenmill splits words with its own re-implementation of spaCy's
  English rules (:mod:`tokenmill.pipeline.document.words`, spaCy is not a dependency), so
  a period is now and then split off where spaCy keeps it (``™.``, ``$290m.``) or the
  reverse: about 2 % of the shared web documents have a sentence end spaCy does not.
  With datatrove given tokenmill's sentence splitter the decisions agree exactly; with
  spaCy's, every differing document either has such a boundary or shares a window with
  one that has.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.decont_data import ALL_CORPORA, corpus_texts
from tests.pipeline.substring_oracle import run_outputs, stage_input
from tokenmill.pipeline.dedup.span_tasks import subtract, union
from tokenmill.pipeline.dedup.span_units import (
    apply_cuts,
    dedup_texts,
    sentence_spans,
    unit_bounds,
    window_keys,
)
from tokenmill.pipeline.document.words import split_words
from tokenmill.pipeline.report.edits import rebuild
from tokenmill.tokenizers import get_encoding

REPO = Path(__file__).resolve().parents[2]
#: global stages before span_dedup: their removals never reach it
EARLIER = ("exact_dedup", "fuzzy_dedup", "classifier_top", "substring_dedup")
S = ["The river runs north.", "Birds sing at dawn.", "Winter comes early here.",
     "Nobody saw the ship.", "Bread was cheap then.", "The lamp went out."]


def _kept(texts: list[str], **kw) -> list[str | None]:
    return [None if why else apply_cuts(t, cuts)
            for t, (cuts, why) in zip(texts, dedup_texts(texts, **kw), strict=True)]


def test_first_occurrence_kept_and_later_copies_cut():
    first = " ".join(S[:4])
    later = "Fresh start today. " + " ".join(S[:3]).upper().replace(".", "!") + " Then more."
    third = "Other words. " + " ".join(S[1:4]) + " End."
    got = _kept([first, later, third], min_doc_words=0, min_num_sentences=0)
    assert got[0] == first  # the first occurrence is never cut
    # case and punctuation do not matter (datatrove's simplify_text)
    assert got[1] == "Fresh start today. Then more."
    assert got[2] == "Other words. End."


def test_a_repeat_inside_one_document_keeps_its_first():
    text = " ".join(S[:3] + ["Middle part."] + S[:3])
    assert _kept([text], min_doc_words=0, min_num_sentences=0) == [" ".join(S[:3])
                                                                  + " Middle part."]


def test_too_short_documents_removed_with_reason():
    long = " ".join(S) + " " + " ".join(f"Word{i} is here." for i in range(12))
    copy = " ".join(S[:3]) + " Short tail."
    out = dedup_texts([long, copy, "Tiny. Doc. Here."])
    assert out[1] == ([], "too_few_words (3 < 50)")
    assert out[2] == ([], None)  # unchanged documents are never judged
    out = dedup_texts([long, copy], min_doc_words=0)
    assert out[1] == ([], "too_few_sentences (1 < 3)")
    assert dedup_texts([long, " ".join(S[:3])], min_doc_words=0)[1] == ([], "empty")


def test_paragraph_mode_cuts_exact_paragraph_repeats():
    a = "Header line\n\nA shared paragraph, word for word.\nOwn text of a."
    b = "Own start of b\nA shared paragraph, word for word.\nOwn end of b\n"
    c = "A shared paragraph, word for word.\n  \nOwn middle\nHeader line\n"
    got = _kept([a, b, c], mode="paragraphs", n=1, min_doc_words=0, min_num_sentences=0)
    assert got == [a, "Own start of b\nOwn end of b\n", "Own middle"]
    # a blank or punctuation-only line is never a repeat
    assert _kept(["x\n\n--\n", "y\n\n--\n"], mode="paragraphs", n=1, min_doc_words=0,
                 min_num_sentences=0) == ["x\n\n--\n", "y\n\n--\n"]


def test_sentences_follow_spacy_sentencizer():
    text = "  Hello.\n\nWorld is big.  ?? Next one. Mr. Smith went. U.S. is big! Yes"
    ends = [b for _, b in sentence_spans(text)]
    assert ends == [8, 23, 27, 37, 53, 66, 70]  # spaCy 3.8 blank("en") + sentencizer
    bounds, units = unit_bounds(text, "sentences")
    assert bounds.tolist() == [0, *ends] and units[1] == "\n\nWorld is big."
    keys, starts = window_keys(units, 3)
    assert keys.dtype == np.uint64 and starts.tolist() == list(range(len(units) - 2))


def test_span_arithmetic():
    assert subtract([(0, 10), (20, 30)], [(5, 8), (9, 22)]) == [(0, 5), (8, 9), (22, 30)]
    assert union([(0, 5), (8, 9)], [(4, 8), (12, 13)]) == [(0, 9), (12, 13)]


class _TokenmillSentences:
    """tokenmill's words and sentences as a datatrove word tokenizer."""

    def __new__(cls):
        from datatrove.utils.word_tokenizers import WordTokenizer, strip_strings

        class Tok(WordTokenizer):
            def word_tokenize(self, text):
                return list(split_words(text))

            def sent_tokenize(self, text):
                return strip_strings([text[a:b] for a, b in sentence_spans(text)])

            def span_tokenize(self, text):
                return sentence_spans(text)
        return Tok("en")


def _datatrove(monkeypatch, folder: Path, texts: list[str], mode: str, n: int,
               ours_split: bool) -> list[str | None]:
    """datatrove's three steps on ``texts`` (one rank, one finder): each kept text, or
    None."""
    pytest.importorskip("spacy", reason="datatrove's English word tokenizer needs spaCy")
    sd = pytest.importorskip("datatrove.pipeline.dedup.sentence_dedup",
                             reason="dev extra: datatrove")
    import xxhash
    from datatrove.data import Document as DtDocument
    from datatrove.utils.hashes import xxhash as dt_xxhash

    # xxhash >= 4 hashes bytes only; datatrove 0.10.1 passes str (xxhash 3 took UTF-8)
    monkeypatch.setattr(dt_xxhash, "xxhash64", lambda d: xxhash.xxh64_intdigest(
        d.encode() if isinstance(d, str) else d))
    cfg = sd.SentDedupConfig(n_sentences=n, split_sentences=mode == "sentences")
    lang = _TokenmillSentences() if ours_split else "en"

    def docs():
        return (DtDocument(text=t, id=str(i)) for i, t in enumerate(texts))
    sd.SentenceDedupSignature(str(folder / "sigs"), config=cfg, language=lang).run(docs())
    sd.SentenceFindDedups(str(folder / "sigs"), str(folder / "dups"), config=cfg).run()
    kept = {d.id: d.text for d in
            sd.SentenceDedupFilter(str(folder / "dups"), config=cfg, language=lang).run(docs())}
    return [kept.get(str(i)) for i in range(len(texts))]


def _apart(ours: list[str | None], theirs: list[str | None]) -> list[int]:
    """Documents decided apart: kept by one only, or kept with other text (edges
    stripped)."""
    return [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            if (a is None) != (b is None) or (a is not None and a.strip() != b.strip())]


def _agree_exactly(monkeypatch, tmp_path: Path, texts: list[str]) -> int:
    n_cut = 0
    for mode, n in (("sentences", 3), ("paragraphs", 1)):
        ours = _kept(texts, mode=mode, n=n)
        theirs = _datatrove(monkeypatch, tmp_path / mode, texts, mode, n, ours_split=True)
        apart = _apart(ours, theirs)
        assert not apart, [(i, ours[i], theirs[i]) for i in apart[:2]]
        n_cut += sum(1 for a, t in zip(ours, texts, strict=True) if a != t)
    return n_cut


def test_agrees_with_datatrove_on_a_sample(monkeypatch, tmp_path):
    texts = [t for _, t in corpus_texts(("c4-en-sample", "cc-main-2019-sample"))][::6]
    texts += texts[::10]  # whole copies: every window repeated
    assert _agree_exactly(monkeypatch, tmp_path, texts) > len(texts) // 10


@pytest.mark.slow
def test_agrees_with_datatrove_on_every_shared_document(monkeypatch, tmp_path):
    texts = [t for _, t in corpus_texts(ALL_CORPORA)]
    assert _agree_exactly(monkeypatch, tmp_path / "ours", texts) > 200
    # datatrove with spaCy's own sentences: differences only through sentence boundaries
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = max(map(len, texts)) + 10
    ours = _kept(texts)
    theirs = _datatrove(monkeypatch, tmp_path / "spacy", texts, "sentences", 3, False)
    split_apart = set()
    for i, t in enumerate(texts):
        if [b for _, b in sentence_spans(t)] != [s.end_char for s in nlp(t).sents]:
            split_apart.add(i)
    touched = set()
    for i in split_apart:
        _, units = unit_bounds(texts[i], "sentences")
        touched.update(window_keys(units, 3)[0].tolist())
    apart = _apart(ours, theirs)
    unexplained = [i for i in apart if i not in split_apart
                   and not touched & set(window_keys(unit_bounds(texts[i], "sentences")[1],
                                                     3)[0].tolist())]
    assert not unexplained, [(i, ours[i], theirs[i]) for i in unexplained[:2]]
    assert len(split_apart) < 0.05 * len(texts) and len(apart) < 0.02 * len(texts)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DATA_ROOT"}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=900)


def _write_corpus(root: Path) -> None:
    """Two sources of numbered sentences; a three-sentence notice in some documents (at
    the end, at the start, alone with one sentence), a paragraph repeated inside one."""
    notice = ("This site uses cookies to improve your experience. By continuing you agree to "
              "our terms. All rights are reserved by the owners.")
    rng = random.Random(5)
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi "
             "omicron pi rho sigma tau upsilon phi chi psi omega").split()
    for name in ("a", "b"):
        rows = []
        for i in range(24):
            t = " ".join(" ".join(rng.choices(words, k=8)).capitalize() + "."
                         for _ in range(8))
            if i % 3 == 1:
                t += "\n" + notice
            if i % 7 == 2:
                t = notice + f" Only this line of {name} {words[i]} is its own."
            if i == 4:
                t = notice + "\n\n" + t
            rows.append(json.dumps({"text": t}))
        (root / name).mkdir(parents=True)
        (root / name / "docs.jsonl").write_text("\n".join(rows) + "\n")


def _mix(tmp_path: Path, span: str, extra: str = "") -> Path:
    mix = tmp_path / f"mix-{len(extra)}.yaml"
    mix.write_text(f"""
name: spans
tokenizer: gpt2
data_root: {tmp_path / 'data'}
block_documents: 10
sources:
  - {{name: a, path: a, license: cc0-1.0}}
  - {{name: b, path: b, license: cc0-1.0}}
span_dedup: {span}
shards: {{tokens_per_shard: 100000, val_fraction: 0.0}}
{extra}""")
    return mix


def _check(out: Path, mode: str, n: int, **mins) -> tuple[dict, dict]:
    """Every check of a finished run against :func:`dedup_texts` on the stage's input;
    returns the edit records by key and the removals by key."""
    manifest, rows, tokens = run_outputs(out)
    docs = stage_input(out, ["a", "b"], {r["key"] for r in rows if r["stage"] in EARLIER})
    want = dict(zip([k for k, _ in docs], dedup_texts([t for _, t in docs], mode, n, **mins),
                    strict=True))
    ours = [r for r in rows if r["stage"] == "span_dedup"]
    edits: dict[str, list] = {}
    for r in ours:
        if r["reason"] == f"span_dedup:edit:repeated_{mode}":
            edits.setdefault(r["key"], []).append(json.loads(r["detail"]) | {"text": r["text"]})
    removed = {r["key"]: r for r in ours if r["reason"] == "span_dedup:removed"}
    assert set(removed) == {k for k, (_, why) in want.items() if why}
    assert set(edits) == {k for k, (cuts, _) in want.items() if cuts}
    enc, texts = get_encoding("gpt2"), dict(docs)
    for key, recs in edits.items():
        recs.sort(key=lambda r: r["start"])
        assert [(r["start"], r["end"]) for r in recs] == want[key][0]
        kept = enc.decode(tokens[key].tolist())
        assert rebuild(kept, recs) == texts[key], key  # the original, from shard + records
        assert enc.encode_ordinary(kept) == tokens[key].tolist(), key  # tokenized again
    for key, r in removed.items():
        assert r["text"] == texts[key] and r["detail"].startswith(f"{want[key][1]} after")
    rec = manifest["span_dedup"]
    assert (rec["mode"], rec["window"]) == (mode, n)
    assert rec["documents_edited"] == len(edits) and rec["documents_removed"] == len(removed)
    assert rec["spans"] == sum(len(v) for v in edits.values())
    assert rec["documents_in"] == len(docs)
    counts = {s["name"]: s["counts"]["filtered"] for s in manifest["sources"]}
    assert sum(c.get("span_dedup", 0) for c in counts.values()) == len(removed)
    assert set(tokens) == set(texts) - set(removed)
    return edits, removed


@pytest.mark.slow
def test_run_cuts_repeated_sentences_and_records_every_edit(tmp_path):
    _write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    r = _run(["run", str(_mix(tmp_path, "{mode: sentences}")), "-q", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert "span_dedup" in r.stdout
    edits, removed = _check(out, "sentences", 3)
    assert len(edits) >= 10 and "a/docs.jsonl#000000002" in removed
    assert "a/docs.jsonl#000000001" not in edits  # the notice's first occurrence
    assert edits["a/docs.jsonl#000000004"][0]["start"] == 0  # a later one, at the start
    report = (out / "report.html").read_text()
    assert "span_dedup:edit:repeated_sentences" in report and "<del>" in report
    # another worker count and partition count: byte-identical shards and manifest
    out2 = tmp_path / "out2"
    r = _run(["run", str(_mix(tmp_path, "{mode: sentences}", "dedup: {partitions: 3}")),
              "-q", "-o", str(out2), "--num-cpus", "1"])
    assert r.returncode == 0, r.stderr
    for p in sorted(out.glob("shards/**/*.bin")):
        assert p.read_bytes() == (out2 / p.relative_to(out)).read_bytes(), p


@pytest.mark.slow
def test_run_paragraph_mode(tmp_path):
    _write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    span = "{mode: paragraphs, min_doc_words: 0, min_num_sentences: 0}"
    r = _run(["run", str(_mix(tmp_path, span)), "-q", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    edits, removed = _check(out, "paragraphs", 1, min_doc_words=0, min_num_sentences=0)
    assert edits and not removed


@pytest.mark.slow
def test_run_with_substring_dedup_cuts_each_span_once(tmp_path):
    """Both global cutting stages on: span dedup leaves out what substring dedup cut (and
    makes no edit of a whitespace leftover), and every edited document is rebuilt from
    its shard text plus both stages' records."""
    _write_corpus(tmp_path / "data")
    out = tmp_path / "out"
    span = "{mode: paragraphs, min_doc_words: 0, min_num_sentences: 0}"
    r = _run(["run", str(_mix(tmp_path, span, "substring_dedup: {min_tokens: 20, scope: all}")),
              "-q", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    manifest, rows, tokens = run_outputs(out)
    texts = dict(stage_input(out, ["a", "b"], set()))
    cuts: dict[str, list] = {}
    for row in rows:
        if row["stage"] in ("substring_dedup", "span_dedup") and ":edit:" in row["reason"]:
            cuts.setdefault(row["key"], []).append(
                json.loads(row["detail"]) | {"text": row["text"], "stage": row["stage"]})
    stages = {c["stage"] for recs in cuts.values() for c in recs}
    assert "substring_dedup" in stages and manifest["substring_dedup"]["documents_edited"]
    # what substring dedup left of a repeated paragraph is only its "\n": no edit
    assert all(not c["text"].isspace() for recs in cuts.values() for c in recs)
    enc = get_encoding("gpt2")
    for key, recs in cuts.items():
        recs.sort(key=lambda c: c["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(recs[:-1], recs[1:], strict=True)), key
        assert rebuild(enc.decode(tokens[key].tolist()), recs) == texts[key], key
