"""A Hugging Face byte-level BPE ``tokenizer.json`` converted to tiktoken ranks.

GPT-2, GPT-NeoX, Llama 3 and Qwen style tokenizers are byte-level BPEs: every vocabulary
string is token bytes written in GPT-2's printable byte alphabet (``bytes_to_unicode`` of
GPT-2's ``encoder.py``), the text is split by a regex (the ``ByteLevel`` pre-tokenizer's
own, GPT-2's, or a ``Split`` regex before a ``ByteLevel`` without one), and the pieces are
merged in the order of the ``merges`` list. tiktoken merges the adjacent pair whose joined
bytes have the lowest rank, and a token's rank is its id; so the ranks are the vocabulary's
ids (bytes decoded from the alphabet), provided the merges' results have increasing ids
(then the lowest rank is the first merge, as in the ``tokenizers`` library). This is how
tiktoken itself reads GPT-2's ``encoder.json`` + ``vocab.bpe``
(``tiktoken.load.data_gym_to_mergeable_bpe_ranks``).

What tiktoken cannot do is refused in one line saying why: another model (Unigram /
SentencePiece, WordPiece, WordLevel), ``byte_fallback``, subword prefixes or suffixes,
dropout, a normalizer other than NFC (it changes the text before splitting; NFC alone is
taken, as GPT-NeoX's and Qwen's, because curation's normalize stage makes every document
NFC before it is tokenized: text given to tokenmill's encoder by hand, such as an n-gram
query, is then the caller's to normalize), a pre-tokenizer that adds a
space or splits otherwise, and added tokens that are not special (they split ordinary
text). Special tokens become tiktoken special tokens; tokenmill encodes documents as
ordinary text (``encode_ordinary``), so a special token's text inside a document is text.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from tokenmill.tokenizers.legality_regex import R50K_PAT
from tokenmill.tokenizers.tiktoken_parts import EncodingParts

# the ByteLevel pre-tokenizer's regex (tokenizers' byte_level.rs), the same splits as GPT-2's
BYTE_LEVEL_PATTERN = R50K_PAT


class TokenizerJsonSpec(BaseModel):
    """The ``tokenizer:`` table of a Hugging Face byte-level BPE ``tokenizer.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer_json: str = Field(min_length=1, description="tokenizer.json path or URL")
    name: str | None = Field(default=None, description="a name for messages and file names "
                             "(default: the name of the folder holding tokenizer.json)")
    eot: str | None = Field(default=None, description="the special token that starts every "
                            "document (default: <|endoftext|>, else the only special token)")


def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable character of each byte -> the byte (``bytes_to_unicode``, inverted)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


class NotConvertible(ValueError):
    """A tokenizer.json that is no byte-level BPE tiktoken can run (the message says why)."""


def _pattern(pre: dict | None) -> str:
    """The split regex of a ``ByteLevel`` pre-tokenizer, or of ``Split`` + ``ByteLevel``."""
    if pre is None:
        raise NotConvertible("no pre-tokenizer: not a byte-level BPE")
    steps = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"]:
        _byte_level(steps[0], regex=True)
        return BYTE_LEVEL_PATTERN
    if kinds == ["Split", "ByteLevel"]:
        split, _ = steps
        _byte_level(steps[1], regex=False)
        if split.get("behavior") != "Isolated" or split.get("invert"):
            raise NotConvertible(f"Split behavior {split.get('behavior')} (invert "
                                 f"{split.get('invert')}): tiktoken keeps each match as a piece")
        pat = split.get("pattern", {})
        if "Regex" in pat:
            return _same_in_both_dialects(pat["Regex"])
        import regex

        return regex.escape(pat["String"])
    raise NotConvertible(f"pre-tokenizer {' + '.join(map(str, kinds))}: tiktoken splits with "
                         "one regex (ByteLevel, or Split then ByteLevel)")


def _same_in_both_dialects(pattern: str) -> str:
    """``pattern`` when it means the same to the ``tokenizers`` library (Oniguruma, Ruby
    syntax) as to tiktoken (fancy-regex). One construct does not: ``X{n,m}+`` repeats the
    interval in Ruby syntax (``(?:X{n,m})+``) but is possessive in fancy-regex."""
    import re

    m = re.search(r"(?<!\\)\{\d+(,\d*)?\}\+", pattern)
    if m:
        raise NotConvertible(
            f"Split regex {m.group(0)!r}: the tokenizers library (Oniguruma) repeats the "
            "interval, tiktoken makes it possessive; write it without the + (as Llama 3's "
            "\\p{N}{1,3})")
    return pattern


def _byte_level(step: dict, regex: bool) -> None:
    if step.get("add_prefix_space"):
        raise NotConvertible("ByteLevel add_prefix_space adds a space before the text, "
                             "which tiktoken does not")
    if step.get("use_regex", True) != regex:
        raise NotConvertible(f"ByteLevel use_regex={step.get('use_regex', True)} after "
                             f"{'a Split' if not regex else 'nothing'}: tiktoken splits once")


def _check_model(model: dict, normalizer: dict | None) -> None:
    kind = model.get("type")
    if kind != "BPE":
        why = {"Unigram": "a SentencePiece Unigram model", "WordPiece": "a WordPiece model",
               "WordLevel": "a WordLevel model"}.get(kind, f"model {kind}")
        raise NotConvertible(f"{why}, not a byte-level BPE: tiktoken runs byte-level BPE only")
    if model.get("byte_fallback"):
        raise NotConvertible("byte_fallback (SentencePiece-style BPE over characters with "
                             "<0xNN> byte tokens), not a byte-level BPE")
    for key in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(key):
            raise NotConvertible(f"BPE {key}={model[key]!r}: tiktoken has no such option")
    if normalizer is not None and not _is_nfc(normalizer):
        raise NotConvertible(f"normalizer {normalizer.get('type')} changes the text before "
                             "it is split; tiktoken has no normalizer (only NFC is taken: "
                             "curation normalizes every document to NFC first)")


def _is_nfc(normalizer: dict) -> bool:
    """Whether ``normalizer`` is Unicode NFC alone (GPT-NeoX's, Qwen's): a no-op on the
    text tokenmill tokenizes, which its normalize stage has made NFC already."""
    if normalizer.get("type") == "Sequence":
        steps = normalizer.get("normalizers") or []
        return bool(steps) and all(_is_nfc(n) for n in steps)
    return normalizer.get("type") == "NFC"


def _merge_pair(m) -> tuple[str, str]:
    return tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1])


def _ranks(model: dict, special_ids: set[int]) -> dict[bytes, int]:
    """Token bytes -> id of the vocabulary less the special tokens (GPT-2's lists
    ``<|endoftext|>`` in both), after checking that the merges' results have increasing
    ids."""
    alphabet = byte_alphabet()
    ranks: dict[bytes, int] = {}
    vocab = {t: i for t, i in model["vocab"].items() if i not in special_ids}
    for text, i in vocab.items():
        try:
            ranks[bytes(alphabet[c] for c in text)] = int(i)
        except KeyError:
            raise NotConvertible(f"vocabulary token {text!r} is not in the byte-level "
                                 "alphabet: not a byte-level BPE") from None
    if len(set(ranks.values())) != len(ranks):
        raise NotConvertible("two vocabulary tokens share an id")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise NotConvertible(f"byte {missing[0]:#04x} has no token: not a byte-level BPE")
    last, merged = -1, set()
    for m in model.get("merges", []):
        a, b = _merge_pair(m)
        tok = "".join((a, b))
        i = vocab.get(tok)
        if i is None or i <= last:
            raise NotConvertible(f"merge {a!r} + {b!r} gives " + (
                "no vocabulary token" if i is None else f"id {i}, not above the previous "
                "merge's: tiktoken ranks are ids and merges go in rank order"))
        last = i
        merged.add(tok)
    for text in vocab:
        if len(text) > 1 and text not in merged:
            raise NotConvertible(f"vocabulary token {text!r} is no merge's result")
    return ranks


def _special(added: list[dict], eot: str | None) -> tuple[dict[str, int], str]:
    special = {}
    for t in added:
        if not t.get("special"):
            raise NotConvertible(f"added token {t['content']!r} is not special: it would "
                                 "split ordinary text, which tiktoken does not")
        special[t["content"]] = int(t["id"])
    if eot is None:
        eot = ("<|endoftext|>" if "<|endoftext|>" in special
               else next(iter(special)) if len(special) == 1 else None)
    if eot not in special:
        raise NotConvertible(f"eot {eot!r} is not one of its special tokens "
                             f"({', '.join(map(repr, special)) or 'none'}); name it with eot:")
    return special, eot


def convert_tokenizer_json(doc: dict, name: str, eot: str | None = None
                           ) -> tuple[EncodingParts, str]:
    """Convert a parsed tokenizer.json to ``(EncodingParts, eot text)`` (module docstring).

    Raises:
        NotConvertible: one line saying what tiktoken cannot do.
    """
    _check_model(doc.get("model") or {}, doc.get("normalizer"))
    pattern = _pattern(doc.get("pre_tokenizer"))
    special, eot = _special(doc.get("added_tokens") or [], eot)
    ranks = _ranks(doc["model"], set(special.values()))
    return EncodingParts(name=name, pat_str=pattern, mergeable_ranks=ranks,
                         special_tokens=special), eot


def load_tokenizer_json(path: str, name: str | None = None, eot: str | None = None
                        ) -> tuple[EncodingParts, str]:
    """Read and convert the tokenizer.json at ``path`` (a path or an fsspec URL).

    Raises:
        ValueError: one line naming the file: unreadable, not JSON, or not convertible.
    """
    name = name or path.rstrip("/").rsplit("/", 2)[-2 if path.count("/") else -1]
    import fsspec  # a path or any fsspec URL

    try:
        with fsspec.open(path, "rb") as f:
            doc = json.loads(f.read())
        parts, eot = convert_tokenizer_json(doc, name, eot)
        parts.encoding()  # tiktoken refuses a pattern it cannot compile
    except NotConvertible as e:
        raise ValueError(f"tokenizer.json {path} cannot be converted to tiktoken ranks: {e}"
                         ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"tokenizer.json {path}: cannot be read ({type(e).__name__}: {e})"
                         ) from None
    return parts, eot
