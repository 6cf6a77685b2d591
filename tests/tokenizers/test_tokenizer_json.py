"""A Hugging Face byte-level BPE tokenizer.json converted to tiktoken ranks encodes every
document of every real corpus as the ``tokenizers`` library does; other tokenizers are
refused in one line saying why."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from tests.tokenizers.tokenizer_files import gpt2_tokenizer_json
from tokenmill.tokenizers import get_encoding, load_tokenizer
from tokenmill.tokenizers.hf_json import convert_tokenizer_json

tokenizers = pytest.importorskip("tokenizers")
# Llama 3's Split regex (its tokenizer.json's pre_tokenizer)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def gpt2_json(tmp_path_factory):
    return gpt2_tokenizer_json(tmp_path_factory.mktemp("hf-gpt2") / "tokenizer.json")


@pytest.fixture(scope="module")
def trained_json(tmp_path_factory):
    """A byte-level BPE of 3,000 ids trained with ``tokenizers`` on the c4 sample, with
    Llama 3's Split regex before a ByteLevel without one."""
    import itertools

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.shared import corpora
    from tests.tokenizers.legality_corpus import iter_corpus_documents

    texts = [t for _, t in itertools.islice(iter_corpus_documents(corpora("c4-en-sample")),
                                            1000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("hf-trained") / "tokenizer.json"
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


def _reference(path):
    """The ``tokenizers`` library's tokenizer of ``path`` without its added tokens: it then
    encodes a special token's text inside a document as text, as ``encode_ordinary`` does."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["added_tokens"] = []
    return tokenizers.Tokenizer.from_str(json.dumps(doc))


def _assert_same(path, name, texts):
    ref = _reference(path)
    enc = get_encoding(load_tokenizer({"tokenizer_json": str(path), "name": name}).name)
    got = enc.encode_ordinary_batch(texts, num_threads=2)
    want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    bad = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
    assert not bad, f"{len(bad)} of {len(texts)} documents differ, first {texts[bad[0]][:200]!r}"
    return sum(map(len, got))


def test_gpt2_json_converts_to_gpt2_ranks(gpt2_json, corpus_docs):
    """The converted GPT-2 has tiktoken's own gpt2 ranks, and encodes a subset of every
    corpus (every 50th document) as ``tokenizers`` does."""
    from tokenmill.tokenizers import identity

    ident = load_tokenizer({"tokenizer_json": str(gpt2_json), "name": "hf-gpt2"})
    assert (ident.ranks_sha256, ident.n_vocab, ident.eot_token) == (
        identity("gpt2").ranks_sha256, 50257, 50256)
    assert ident.source.tokenizer_json == str(gpt2_json)
    assert _assert_same(gpt2_json, "hf-gpt2", [t for _, t in corpus_docs[::50]]) > 100_000


def test_trained_json_encodes_as_tokenizers_does(trained_json, corpus_docs):
    """A BPE trained in the test (merges unlike GPT-2's, Split + ByteLevel): a subset of
    every corpus (every 50th document) encodes as ``tokenizers`` does."""
    ident = load_tokenizer({"tokenizer_json": str(trained_json), "name": "hf-trained"})
    assert ident.n_vocab == 3000 and ident.eot_token == 0
    assert _assert_same(trained_json, "hf-trained", [t for _, t in corpus_docs[::50]]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2_json", "trained_json"])
def test_every_document_of_every_corpus_encodes_as_tokenizers_does(which, corpus_docs,
                                                                   request):
    path = request.getfixturevalue(which)
    n = _assert_same(path, f"hf-{which}", [t for _, t in corpus_docs])
    print(f"{which}: {len(corpus_docs):,} documents, {n:,} tokens, all equal")


def test_an_nfc_normalizer_is_taken_for_the_nfc_text_curation_tokenizes(gpt2_json, tmp_path,
                                                                        corpus_docs):
    """GPT-NeoX and Qwen put NFC before the split: converted, the tokenizer encodes the
    documents as ``tokenizers`` does once they are NFC, which the normalize stage makes
    every document before it is tokenized."""
    import unicodedata

    from tokenmill.pipeline.read.normalize import normalize_text

    doc = _mutated(gpt2_json, lambda d: d.update(normalizer={"type": "NFC"}))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    texts = [normalize_text(t) for _, t in corpus_docs[::50]]
    texts.append(normalize_text("Cafe\u0301 \u212b and e\u0301 combined"))
    assert all(unicodedata.is_normalized("NFC", t) for t in texts)
    assert _assert_same(path, "hf-nfc", texts) > 100_000


def _mutated(gpt2_json, change):
    doc = json.loads(gpt2_json.read_text(encoding="utf-8"))
    change(doc)
    return doc


@pytest.mark.parametrize("change, why", [
    (lambda d: d.update(model={"type": "Unigram", "vocab": [["a", 0.0]]}),
     "SentencePiece Unigram model"),
    (lambda d: d.update(model={"type": "WordPiece", "vocab": {"a": 0}}), "WordPiece model"),
    (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
    (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer NFKC changes the text"),
    (lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Lowercase"}]}), "normalizer Sequence changes the text"),
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
    (lambda d: d.update(pre_tokenizer={"type": "Metaspace"}), "pre-tokenizer Metaspace"),
    (lambda d: d["added_tokens"].append({"id": 50257, "content": "<pad>", "special": False}),
     "added token '<pad>' is not special"),
    (lambda d: d["model"]["merges"].reverse(), "tiktoken ranks are ids"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}+|\p{L}+"}, "behavior": "Isolated",
         "invert": False}, {"type": "ByteLevel", "use_regex": False}]}),
     "repeats the interval"),
])
def test_what_tiktoken_cannot_run_is_refused_saying_why(gpt2_json, change, why):
    with pytest.raises(ValueError, match=why) as e:
        convert_tokenizer_json(_mutated(gpt2_json, change), "x")
    assert "\n" not in str(e.value)


def test_refusal_through_the_cli_is_one_line(gpt2_json, tmp_path):
    bad = tmp_path / "sp" / "tokenizer.json"
    bad.parent.mkdir()
    doc = _mutated(gpt2_json, lambda d: d["model"].update(byte_fallback=True))
    bad.write_text(json.dumps(doc), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "tokenizer", "info", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "byte_fallback" in lines[0], r.stderr
    good = subprocess.run([sys.executable, "-m", "tokenmill.cli", "tokenizer", "info",
                           str(gpt2_json)], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and "identity_sha256" in good.stdout, good.stderr


def test_a_relative_tokenizer_json_on_the_command_line_is_read_once(gpt2_json, tmp_path):
    """``tokenizer info sub/tokenizer.json`` from the folder above: the path is taken from
    the working folder, not joined to its own folder again."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tokenizer.json").write_bytes(gpt2_json.read_bytes())
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "tokenizer", "info",
                        "sub/tokenizer.json"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "50257" in r.stdout


def test_copy_is_not_shared(gpt2_json):
    doc = json.loads(gpt2_json.read_text(encoding="utf-8"))
    before = copy.deepcopy(doc)
    convert_tokenizer_json(doc, "y")
    assert doc == before
