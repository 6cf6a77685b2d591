"""Language identification (tokenmill.pipeline.document.language) with the network unreachable."""

from __future__ import annotations

import gzip
import json
import socket
from collections import Counter

import fasttext
import pytest

from tests.shared import corpora
from tokenmill.pipeline.document import language as langid
from tokenmill.pipeline.document.language import (
    LanguageFilter,
    detect_language,
    detect_languages,
    fasttext_model_path,
)
from tokenmill.pipeline.stage import Document


@pytest.fixture
def offline(monkeypatch):
    """Every attempt to reach the network raises; model caches are cleared so the models
    are loaded inside the test."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled by test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    langid._fasttext_model.cache_clear()
    langid._py3langid_model.cache_clear()
    yield attempts
    assert attempts == [], f"language id tried to reach the network: {attempts}"


def _c4(n: int) -> list[str]:
    f = next(corpora("c4-en-sample", "data").glob("*.json.gz"))
    with gzip.open(f, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for _, line in zip(range(n), fh, strict=False)]


def _cc() -> list[str]:
    out = []
    for f in sorted(corpora("cc-main-2019-sample", "data").glob("*.jsonl.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            out += [json.loads(line)["text"] for line in fh]
    return out


def test_offline_books_and_c4(offline):
    books = corpora("books-public-domain", "data")
    assert detect_language((books / "botchan.txt").read_text("utf-8")[5000:9000])[0] == "en"
    lang, score = detect_language(
        (books / "wagahaiwa_nekodearu.txt").read_text("utf-8")[5000:9000])
    assert lang == "ja" and score > 0.9
    assert detect_language("   \n ") == ("und", 0.0)
    c4 = _c4(300)
    langs = Counter(detect_language(t)[0] for t in c4)
    print("c4-en-sample:", langs.most_common(5))
    assert langs["en"] >= 0.95 * len(c4)
    # the second backend (py3langid) agrees on English web text
    agree = sum(detect_language(t, "py3langid")[0] == "en" for t in c4[:100])
    assert agree >= 90
    assert fasttext_model_path().name == "lid.176.ftz"


def test_filter_on_multilingual_cc_main(offline):
    """cc-main-2019-sample holds many languages: the filter labels every document, keeps
    only allowed ones above the score, and quarantines the rest with a reason."""
    texts = _cc()
    docs = [Document(key=f"cc/{i:05d}", source="cc", text=t) for i, t in enumerate(texts)]
    stage = LanguageFilter(languages=["en", "de"], min_score=0.65)
    rejected = []
    stage.sink = rejected.append
    kept = list(stage(docs))
    dist = Counter(d.metadata["language"] for d in docs)
    print("cc-main languages:", dist.most_common(12))
    print("stage:", stage.stats.to_dict())
    assert len(dist) >= 8, "the sample is multilingual"
    assert all("language" in d.metadata and 0.0 <= d.metadata["language_score"] <= 1.0
               for d in docs)
    assert kept and all(d.metadata["language"] in {"en", "de"}
                        and d.metadata["language_score"] >= 0.65 for d in kept)
    assert len(kept) + len(rejected) == len(docs)
    reasons = Counter(r.reason for r in rejected)
    assert reasons["language:not_allowed"] > 0 and reasons["language:low_score"] > 0
    assert set(reasons) <= {"language:not_allowed", "language:low_score"}
    for r in rejected:
        if r.reason == "language:not_allowed":
            assert r.detail.split()[0] not in {"en", "de"}
    # labelling only
    label_only = LanguageFilter(languages=None)
    assert len(list(label_only(docs[:50]))) == 50


def test_bad_backend():
    with pytest.raises(ValueError, match="unknown language-id backend"):
        LanguageFilter(backend="cld3")


def test_fasttext_line_gives_the_words_of_the_split_text():
    """The line handed to fastText reads as the text's words joined by single spaces: the
    same words (fastText splits at runs of space, tab, \\v, \\f, \\r and NUL) and the same
    prediction, for ASCII and other texts, with the whitespace fastText does not split
    at."""
    model = fasttext.load_model(str(fasttext_model_path()))  # fastText's own reading
    texts = ["plain words\nand lines\n", "a\x1cb c\x1fd\ne", "caf\u00e9 au lait\u00a0ici\n",
             "\u3000\u6f22\u5b57\u3000\u304b\u306a\u2028next\u2029x\x85y", "t\tab\x0bv\x0cf\rr\0n",
             "  \n", "", "ok\u202f\u205f\u1680\u2000\u200a end", "a" * 30 + "\u00a0b" * 5]
    for text in texts:
        line = langid.fasttext_line(text, 40)
        assert "\n" not in line
        words = text[:40].split()
        assert line.replace("\0", " ").split() == [w for x in words for w in x.split("\0")]
        if words:
            assert model.f.predict(line + "\n", 1, 0.0, "strict") == \
                model.f.predict(" ".join(words) + "\n", 1, 0.0, "strict")
        else:
            assert line == ""


def test_batched_prediction_equals_one_text_at_a_time():
    """The filter predicts its documents in batches (one call of the compiled model): every
    label and score is the one :func:`detect_language` gives for the text alone, blank
    texts included, across batch edges."""
    texts = _cc()[:300] + ["", "  \n ", "caf\u00e9\u00a0ici\nencore"] + _c4(40)
    want = [detect_language(t) for t in texts]
    assert detect_languages(texts) == want
    docs = [Document(key=f"k{i:04d}", source="s", text=t) for i, t in enumerate(texts)]
    stage = LanguageFilter(languages=None)
    stage.batch = 7
    assert len(list(stage(docs))) == len(docs)
    assert [(d.metadata["language"], d.metadata["language_score"]) for d in docs] == [
        (lang, round(score, 4)) for lang, score in want]
