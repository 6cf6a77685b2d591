"""Tokenizer files made in tests: a tiktoken-format ranks file that is not a built-in
encoding's (GPT-2's ranks with the 256 byte tokens' ids reversed: the same merges, other
ids), its ``tokenizer:`` table, and GPT-2's ``tokenizer.json`` built with the
``tokenizers`` library from the ``encoder.json`` / ``vocab.bpe`` in tiktoken's cache."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.shared import shared_data
from tokenmill.tokenizers.legality_regex import R50K_PAT

RENUMBERED = "gpt2-renumbered"
SPECIAL = {"<|endoftext|>": 50256, "<|pad|>": 50257}
GPT2_ENCODER_JSON = "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"  # tiktoken cache file names
GPT2_VOCAB_BPE = "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"


def renumbered_ranks() -> dict[bytes, int]:
    """GPT-2's ranks with byte token ``b`` (id ``b'``) given id ``255 - b'``."""
    from tokenmill.tokenizers.tiktoken_parts import encoding_parts

    ranks = encoding_parts("gpt2").mergeable_ranks
    return {t: (255 - r if r < 256 else r) for t, r in ranks.items()}


def write_renumbered(folder: Path) -> dict:
    """Write ``renumbered.tiktoken`` and ``tokenizer.yaml`` (its table, the ranks path
    relative to the folder) into ``folder``; return the table."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    ranks = sorted(renumbered_ranks().items(), key=lambda kv: kv[1])
    (folder / "renumbered.tiktoken").write_bytes(
        b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))
    table = {"name": RENUMBERED, "ranks": "renumbered.tiktoken", "pattern": R50K_PAT,
             "special_tokens": dict(SPECIAL), "eot": "<|endoftext|>"}
    (folder / "tokenizer.yaml").write_text(yaml.safe_dump(table, allow_unicode=True))
    return table


def gpt2_tokenizer_json(path: Path) -> Path:
    """GPT-2 as the ``tokenizers`` library builds it: BPE(encoder.json, vocab.bpe merges),
    ByteLevel pre-tokenizer without a prefix space, ``<|endoftext|>`` special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    cache = shared_data("tiktoken")
    vocab = json.loads((cache / GPT2_ENCODER_JSON).read_text(encoding="utf-8"))
    lines = (cache / GPT2_VOCAB_BPE).read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split()) for line in lines if line]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tok.to_str(), encoding="utf-8")
    return path
