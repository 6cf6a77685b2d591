"""The tokenize stage's ids are tiktoken's ``encode_ordinary`` ids, EOT first, whatever
the text holds (a literal special token, a lone surrogate, nothing) and however many
threads encode them."""

from __future__ import annotations

import numpy as np
import pytest

from tokenmill.pipeline.run.tokenize import tokenize_batch
from tokenmill.tokenizers import get_encoding

TEXTS = ["a <|endoftext|> b <|fim_prefix|>", "x\ud800y", "", " héllo wörld 日本 🙂",
         "word " * 3000]


@pytest.mark.parametrize("encoding", ["gpt2", "cl100k_base"])
@pytest.mark.parametrize("threads", [1, 3])
def test_ids_are_encode_ordinary_with_eot_first(encoding, threads):
    enc = get_encoding(encoding)
    tokens, lengths = tokenize_batch(TEXTS, encoding, num_threads=threads)
    want = [[enc.eot_token, *enc.encode_ordinary(t)] for t in TEXTS]
    assert tokens.dtype == np.uint32 and lengths.dtype == np.int64
    assert lengths.tolist() == [len(w) for w in want]
    assert tokens.tolist() == [i for w in want for i in w]
    assert int((tokens == enc.eot_token).sum()) == len(TEXTS)  # only the separators


def test_no_texts():
    tokens, lengths = tokenize_batch([], "gpt2")
    assert tokens.size == 0 and lengths.size == 0
