"""Quality filters (tokenmill.pipeline.document.quality): unit rules and human labels (DCLM)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.shared import corpora
from tokenmill.pipeline.document.quality import (
    QUALITY_FILTERS,
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
    build_quality_filter,
    split_into_words,
)
from tokenmill.pipeline.document.repetition import (
    _dup_ngram_chars,
    _top_ngram_chars,
    ngram_stats,
)
from tokenmill.pipeline.stage import Document

PROSE = (
    "The committee met on Tuesday to review the budget and to discuss the plans that "
    "the city has for the new library. Members agreed that the project should move "
    "forward with a smaller design. The mayor said that residents have waited long "
    "enough for a place to read and study. Construction is expected to begin in the "
    "spring, and the building should open to the public within two years of that date. "
    "Local schools have already asked to bring their classes to the new reading rooms."
)


def _doc(text: str, key: str = "t/x#0") -> Document:
    return Document(key=key, source="t", text=text)


def _why(stage, text: str) -> str | None:
    return stage.reason(_doc(text))


def test_gopher_quality_rules():
    g = GopherQualityFilter()
    assert _why(g, PROSE) is None
    assert _why(g, "the cat and the dog. " * 3) == "gopher_quality:word_count"
    assert _why(g, " ".join(["x"] * 60) + " the and") == "gopher_quality:mean_word_length"
    assert _why(g, PROSE + " #tag" * 20) == "gopher_quality:symbol_ratio"
    assert _why(g, PROSE + "\n" + "\n".join(f"item {i}..." for i in range(6))) \
        == "gopher_quality:ellipsis_lines"
    bullets = "\n".join(f"- {s}" for s in PROSE.split(". "))
    assert _why(g, bullets) == "gopher_quality:bullet_lines"
    assert _why(g, PROSE + " 1234 5678 90.12 -- %% " * 20) == "gopher_quality:alpha_ratio"
    no_stop = " ".join([w for w in PROSE.split() if w.lower() not in
                       {"the", "be", "to", "of", "and", "that", "have", "with"}] * 2)
    assert _why(g, no_stop) == "gopher_quality:stop_words"
    assert _why(GopherQualityFilter(min_stop_words=None), no_stop) is None


def test_gopher_repetition_rules():
    r = GopherRepetitionFilter()
    assert _why(r, PROSE) is None
    lines = "\n".join(["Buy cheap watches now"] * 5 + PROSE.split(". "))
    assert _why(r, lines) == "gopher_repetition:dup_line_frac"
    paras = "\n\n".join([PROSE, "Click here to subscribe to our newsletter today."] * 3)
    assert _why(r, paras).startswith("gopher_repetition:dup_para")
    spam = PROSE + " " + " ".join(["best price"] * 40)
    assert _why(r, spam) == "gopher_repetition:top_2_gram"


def _dclm_texts() -> list[str]:
    return [json.loads(line)["text"]
            for f in sorted(corpora("dclm-quality-labels", "data").glob("*.jsonl"))
            for line in f.open(encoding="utf-8")]


def test_ngram_stats_kernel_matches_python_reference():
    """The numba n-gram statistics equal the plain-Python (datatrove-style) ones."""
    texts = _dclm_texts()[:300] + [PROSE + " " + " ".join(["best price"] * 40),
                                   "a b a b a b c", "", "one"]
    for t in texts:
        w = split_into_words(t)
        top, dup = ngram_stats(np.fromiter(map(hash, w), np.int64, len(w)),
                                np.fromiter(map(len, w), np.int64, len(w)),
                                np.array([2, 3, 4]), np.arange(5, 11))
        assert top.tolist() == [_top_ngram_chars(w, n) for n in (2, 3, 4)], t[:60]
        assert dup.tolist() == [_dup_ngram_chars(w, n) for n in range(5, 11)], t[:60]


def test_ngram_stats_on_random_repetitive_words():
    """Few distinct words, so n-grams repeat, tie and overlap: the hash table counts and
    skips as the plain-Python reference does, for any sizes in any order."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        w = [str(x) * int(x) for x in rng.integers(1, 5, int(rng.integers(0, 30)))]
        sizes = rng.integers(1, 12, 3)
        top, dup = ngram_stats(np.fromiter(map(hash, w), np.int64, len(w)),
                               np.fromiter(map(len, w), np.int64, len(w)),
                               sizes, sizes[::-1].copy())
        assert top.tolist() == [_top_ngram_chars(w, int(n)) for n in sizes], w
        assert dup.tolist() == [_dup_ngram_chars(w, int(n)) for n in sizes[::-1]], w


def test_c4_rules_and_line_edits():
    c = C4QualityFilter()
    d = _doc(PROSE.replace(". ", ".\n") + "\nPlease enable JavaScript to view this page.\n"
             "We use cookies to improve your experience.\nMenu\nHome | About")
    assert c.reason(d) is None
    assert "JavaScript" not in d.text and "cookies" not in d.text and "Menu" not in d.text
    assert d.text.startswith("The committee met")
    assert c.line_stats["line_javascript"] == 1 and c.line_stats["line_policy"] == 1
    assert _why(c, PROSE + "\nLorem ipsum dolor sit amet, consectetur.") == "c4:lorem_ipsum"
    assert _why(c, PROSE + "\nfunction f() { return 1; }.") == "c4:curly_bracket"
    assert _why(c, "Only one sentence here.") == "c4:too_few_sentences"
    assert _why(C4QualityFilter(bad_words=["library"]), PROSE) == "c4:bad_words"
    keep_text = _doc(PROSE + "\nmenu")
    assert C4QualityFilter(modify_text=False).reason(keep_text) is None
    assert keep_text.text.endswith("menu")


def test_fineweb_rules():
    f = FineWebQualityFilter()
    assert _why(f, PROSE) is None
    assert _why(f, "\n\n  \n") == "fineweb:empty"
    assert _why(f, "\n".join(f"Product name number {i} in the catalogue list" for i in range(20))) \
        == "fineweb:line_punct_ratio"
    assert _why(f, "\n".join(f"Item {i}." for i in range(20)) + "\n" + PROSE) \
        == "fineweb:short_line_ratio"
    dup = PROSE + "\n" + "\n".join(["Share this article with your friends on the web."] * 3)
    assert _why(f, dup) == "fineweb:char_dup_ratio"
    listy = "\n".join(f"Step {i} is to open the lid and then wait." for i in range(30))
    assert _why(FineWebQualityFilter(short_line_thr=1.1), listy) is None
    assert _why(f, "\n".join(f"a{i} b." for i in range(30)) + "\n" + "x" * 40 + ".") in (
        "fineweb:short_line_ratio", "fineweb:list_ratio")
    assert _why(FineWebQualityFilter(short_line_thr=1.1),
                "\n".join(f"Do it{i}." for i in range(30))) == "fineweb:list_ratio"


def test_registry_config_and_counters():
    assert set(QUALITY_FILTERS) == {"gopher_quality", "gopher_repetition", "c4", "fineweb"}
    g = build_quality_filter("gopher_quality", min_doc_words=5)
    assert g.config["min_doc_words"] == 5 and g.config["max_avg_word_length"] == 10
    with pytest.raises(ValueError, match="unknown quality filter 'nope'"):
        build_quality_filter("nope")
    with pytest.raises(TypeError):
        build_quality_filter("fineweb", min_doc_words=3)
    rejected = []
    g.sink = rejected.append
    out = list(g([_doc(PROSE, "t/a#0"), _doc("hi", "t/b#0"), _doc("## ## ## ##", "t/c#0")]))
    assert [d.key for d in out] == ["t/a#0"]
    assert g.stats.to_dict() == {"docs_in": 3, "docs_out": 1, "rejected": {
        "gopher_quality:word_count": 2}}
    assert [(r.key, r.stage, r.reason) for r in rejected] == [
        ("t/b#0", "gopher_quality", "gopher_quality:word_count"),
        ("t/c#0", "gopher_quality", "gopher_quality:word_count")]
    assert g.fingerprint() != build_quality_filter("gopher_quality").fingerprint()


def test_dclm_human_labels():
    """Per filter and combined (all four chained, as a datamix would run them): share of
    human-labelled good (1) and bad (0) documents kept. Combined must keep a larger share
    of good documents than of bad ones, and so must every single filter."""
    docs = []
    for f in sorted(corpora("dclm-quality-labels", "data").glob("*.jsonl")):
        for i, line in enumerate(f.open(encoding="utf-8")):
            row = json.loads(line)
            docs.append((f"dclm/{f.name}#{i:05d}", row["text"], int(row["label"])))
    labels = {k: lab for k, _, lab in docs}
    n = {lab: sum(1 for v in labels.values() if v == lab) for lab in (0, 1)}
    assert n[0] > 100 and n[1] > 100

    def share(kept_keys: set[str], lab: int) -> float:
        return sum(1 for k in kept_keys if labels[k] == lab) / n[lab]

    print(f"\n{'filter':20s} {'keep label 1':>12s} {'keep label 0':>12s}  top reasons")
    rows = {}
    for name, cls in QUALITY_FILTERS.items():
        stage = cls()
        kept = {d.key for d in stage(_doc(t, k) for k, t, _ in docs)}
        rows[name] = (share(kept, 1), share(kept, 0))
        top = ", ".join(f"{r.split(':')[1]}={c}" for r, c in
                        stage.stats.rejected.most_common(3))
        print(f"{name:20s} {rows[name][0]:12.3f} {rows[name][1]:12.3f}  {top}")
    stream = (_doc(t, k) for k, t, _ in docs)
    for cls in QUALITY_FILTERS.values():
        stream = cls()(stream)
    kept = {d.key for d in stream}
    combined = (share(kept, 1), share(kept, 0))
    print(f"{'combined':20s} {combined[0]:12.3f} {combined[1]:12.3f}")
    assert combined[0] > combined[1] + 0.25
    for name, (good, bad) in rows.items():
        assert good >= bad, name
