"""Tokenization with tiktoken: ``encode_ordinary``'s ids as numpy arrays, an EOT before
every document.

``encode_ordinary`` never produces special ids, so a literal ``<|endoftext|>`` inside a
document is tokenized as ordinary text; the only EOT ids in a shard are the document
separators (modded-nanogpt's FineWeb convention: EOT, then the document).
"""

from __future__ import annotations

import functools
import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tiktoken

from tokenmill.pipeline.stage import Configured
from tokenmill.tokenizers import get_encoding, load_checked


def encode_ordinary_array(enc: tiktoken.Encoding, text: str) -> np.ndarray:
    """``enc.encode_ordinary(text)`` as uint32[n], straight from tiktoken's buffer
    (``encode_to_numpy`` with no special token allowed nor checked: the same ids, without
    a Python int per token). Lone surrogates are replaced as ``encode_ordinary`` does."""
    try:
        return enc.encode_to_numpy(text, disallowed_special=())
    except UnicodeEncodeError:  # as tiktoken's encode_ordinary: U+FFFD for lone surrogates
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return enc.encode_to_numpy(text, disallowed_special=())


def tokenize_batch(texts: list[str], encoding: str | dict, num_threads: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize documents, each prefixed by EOT, with a built-in encoding (its name) or a
    tokenizer loaded from a recorded identity (a dict, as the datamix's
    ``tokenizer_for_stage`` gives); ``num_threads`` > 1: in a thread pool (tiktoken
    releases the GIL while it encodes).

    Returns:
        tokens: uint32[sum(lengths)], documents concatenated in input order.
        lengths: int64[len(texts)], tokens per document, EOT included.
    """
    enc = (get_encoding(encoding) if isinstance(encoding, str)
           else load_checked(encoding, "the datamix's tokenizer"))
    if not texts:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64)
    if num_threads > 1:
        with ThreadPoolExecutor(num_threads) as pool:
            encoded = list(pool.map(functools.partial(encode_ordinary_array, enc), texts))
    else:
        encoded = [encode_ordinary_array(enc, t) for t in texts]
    eot = np.array([enc.eot_token], dtype=np.uint32)
    lengths = np.fromiter((t.size + 1 for t in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.concatenate([part for t in encoded for part in (eot, t)])
    return tokens, lengths


def split_hash(key: str) -> int:
    """The document key's place in the validation order: the first 8 bytes of its
    sha256, big-endian, as an integer in [0, 2**64)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def split_of(key: str, val_fraction: float) -> str:
    """Deterministic train/val assignment from the sha256 of the document key: ``val``
    when :func:`split_hash` < ``val_fraction`` × 2**64 (the shard writer may move the
    next documents in that order to ``val`` to reach a source's minimum)."""
    if val_fraction <= 0:
        return "train"
    return "val" if split_hash(key) < val_fraction * 2**64 else "train"


class Tokenize(Configured):
    """The tokenize stage (scope ``block``): tiktoken ``encode_ordinary`` with an EOT
    before every document, and the document's split (``split_of`` its key), a whole
    block at once (:meth:`encode`, what the tokenize task calls)."""

    name = "tokenize"
    version = 2

    def __init__(self, tokenizer: str | dict = "gpt2", val_fraction: float = 0.01) -> None:
        super().__init__(tokenizer=tokenizer, val_fraction=val_fraction)
        self.tokenizer = tokenizer
        self.val_fraction = val_fraction

    def encode(self, keys: list[str], texts: list[str]
               ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(uint32 tokens of all documents, int64 tokens per document, split per document)."""
        tokens, lengths = tokenize_batch(texts, self.tokenizer)
        return tokens, lengths, [split_of(k, self.val_fraction) for k in keys]
