"""The per-document word analysis the quality filters share: every number equals what the
word splitter gives for the same text, on real and hostile texts, across table resets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.shared import corpora
from tokenmill.pipeline.document import analysis
from tokenmill.pipeline.document.words import count_sentences, split_words, word_counts


def _texts() -> list[str]:
    naughty = json.loads((corpora("naughty-strings") / "data" / "blns.json").read_text())
    c4 = (corpora("c4-en-sample") / "data").glob("*.gz")
    import gzip

    web = []
    for f in sorted(c4)[:1]:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            web += [json.loads(line)["text"] for line, _ in zip(fh, range(60), strict=False)]
    return [t for t in naughty + web if isinstance(t, str)]


@pytest.mark.parametrize("max_chunks", [analysis.MAX_CHUNKS, 50])
def test_chunk_numbers_match_the_word_splitter(monkeypatch, max_chunks):
    monkeypatch.setattr(analysis, "MAX_CHUNKS", max_chunks)  # 50: the table resets often
    monkeypatch.setattr(analysis, "_TABLE", analysis._ChunkTable())  # an empty table
    analysis.release()
    gen0 = analysis.table().generation
    for text in _texts():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            continue
        ids = analysis.chunk_ids(text)
        assert analysis.chunk_ids(text) is ids or max_chunks == 50  # cached per text
        t = analysis.table()
        words = split_words(text)
        n_words, n_content, chars, n_alpha, _ = word_counts(text)
        assert analysis.totals(ids).tolist() == [n_words, n_content, chars, n_alpha]
        wh, wl = analysis.word_hashes(ids)
        assert wh.tolist() == [hash(w) for w in words]
        assert wl.tolist() == [len(w) for w in words]
        lines = [ln.split() for ln in text.splitlines()]
        ends = np.cumsum([len(ln) for ln in lines]).astype(np.int64)
        starts = ends - [len(ln) for ln in lines]
        assert analysis.sentences(ids, starts, ends) == sum(
            count_sentences(list(split_words(" ".join(ln)))) for ln in lines)
        assert t is analysis.table()
    if max_chunks == 50:
        assert analysis.table().generation > gen0
    analysis.release()
