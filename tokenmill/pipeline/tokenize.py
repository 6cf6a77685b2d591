"""Tokenization with tiktoken: ``encode_ordinary`` in batches, an EOT before every document.

``encode_ordinary`` never produces special ids, so a literal ``<|endoftext|>`` inside a
document is tokenized as ordinary text; the only EOT ids in a shard are the document
separators (modded-nanogpt's FineWeb convention: EOT, then the document).
"""

from __future__ import annotations

import numpy as np

from tokenmill.tokenizers import get_encoding


def tokenize_batch(texts: list[str], encoding: str, num_threads: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize documents, each prefixed by EOT.

    Returns:
        tokens: uint32[sum(lengths)], documents concatenated in input order.
        lengths: int64[len(texts)], tokens per document, EOT included.
    """
    enc = get_encoding(encoding)
    if not texts:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64)
    encoded = enc.encode_ordinary_batch(texts, num_threads=num_threads)
    lengths = np.fromiter((len(t) + 1 for t in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.empty(int(lengths.sum()), dtype=np.uint32)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    tokens[starts] = enc.eot_token
    for s, t in zip(starts, encoded, strict=True):
        tokens[s + 1 : s + 1 + len(t)] = t
    return tokens, lengths
