"""Exact-substring dedup (``substring_dedup`` in a datamix): the suffix-array search against
brute force, and ``tokenmill run`` against a second implementation that hashes every
window (:mod:`tests.pipeline.substring_oracle`), with every edited document rebuilt from
the shards plus the quarantine's edit records, re-encoding to its own tokens, and the
n-gram index over the shards counting what brute force counts."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.substring_oracle import repeated_spans, run_outputs, stage_input
from tests.shared import corpora
from tokenmill.pipeline.dedup import substring_spans as spans
from tokenmill.pipeline.report.edits import rebuild
from tokenmill.tokenizers import get_encoding

REPO = Path(__file__).resolve().parents[2]
#: global stages before substring_dedup: their removals never reach it
EARLIER = ("exact_dedup", "fuzzy_dedup", "classifier_top")


def test_suffix_array_spans_match_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(120):
        vocab, k = int(rng.integers(2, 6)), int(rng.integers(1, 6))
        docs = [rng.integers(0, vocab, int(rng.integers(0, 30))).astype(np.int32)
                for _ in range(int(rng.integers(1, 8)))]
        want = repeated_spans(docs, k)
        for part_tokens in (1, 20, 1000):  # one document a part, a few, all in one
            got = spans.repeated_token_spans(docs, k, part_tokens)
            assert [[tuple(s) for s in g.tolist()] for g in got] == want, (k, docs)


def test_a_cut_inside_a_character_takes_it_whole():
    enc = get_encoding("gpt2")
    text = "ab ꙮ cd"
    tokens = np.asarray(enc.encode_ordinary(text), np.int64)
    table = np.array([len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)])
    ends = spans.token_byte_offsets(text, tokens, table)
    leads = spans.lead_counts(text)
    emoji = text.index("ꙮ")
    lo, hi = len(text[:emoji].encode()), len(text[:emoji + 1].encode())
    inside = [i for i in range(tokens.size) if lo < ends[i] < hi]
    assert inside, "the emoji's bytes should be split between tokens"
    assert spans.char_span(leads, ends, inside[0], tokens.size) == (emoji, len(text))
    assert spans.char_span(leads, ends, 0, inside[0]) == (0, emoji + 1)
    assert spans.token_byte_offsets(text, tokens[:-1], table) is None


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega").split()
BOILER = ("This page is licensed under the Creative Commons Attribution-ShareAlike License; "
          "additional terms may apply — café naïve 日本語 ꙮ 𝔘. By using this site, you agree "
          "to the Terms of Use and Privacy Policy.")


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _write_corpus(root: Path) -> None:
    """Two sources: unique random-word documents, the boilerplate in some (twice in some,
    in both sources), a document that is only the boilerplate, a span repeated inside
    one document."""
    rng = random.Random(7)
    for name in ("a", "b"):
        rows = []
        for i in range(36):
            t = _words(rng, 60)
            if i % 4 == 1:
                t += "\n\n" + BOILER + " " + _words(rng, 10)
            if i % 9 == 2:
                t = BOILER + "\n" + t + "\n" + BOILER
            if i == 5:
                t = BOILER
            if i == 7:
                span = _words(rng, 40)
                t = span + " and " + _words(rng, 10) + " " + span
            rows.append(json.dumps({"text": t}))
        (root / name).mkdir(parents=True)
        (root / name / "docs.jsonl").write_text("\n".join(rows) + "\n")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """``tokenmill ARGS``; the datamix's own ``data_root`` holds (the override is dropped)."""
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DATA_ROOT"}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=900)


def _same_cuts(got: list[tuple[int, int]], want: list[tuple[int, int]], ids: np.ndarray,
               enc) -> None:
    """The stage's cuts are the oracle's spans, two of them merged only when the tokens
    between them hold no whole character (a cut takes whole characters, so the two
    cuts meet)."""
    merged: list[list[int]] = []
    for a, b in want:
        if merged:
            gap = enc.decode_bytes(ids[merged[-1][1] : a].tolist())
            if not gap.decode("utf-8", errors="ignore"):
                merged[-1][1] = b
                continue
        merged.append([a, b])
    assert got == [tuple(m) for m in merged], (got, want)


def _check_run(out: Path, sources: list[str], k: int, scope: str) -> dict[str, list]:
    """Every check on a finished run; returns the edit records by key."""
    manifest, rows, tokens = run_outputs(out)
    enc = get_encoding(manifest["tokenizer"]["name"])
    before = {r["key"] for r in rows if r["stage"] in EARLIER}
    docs = stage_input(out, sources, before)
    ids = [np.asarray(enc.encode_ordinary(t), np.int64) for _, t in docs]
    reset = [scope == "source" and (i == 0 or docs[i - 1][0].split("/")[0] != key.split("/")[0])
             for i, (key, _) in enumerate(docs)]
    want = dict(zip([k_ for k_, _ in docs], repeated_spans(ids, k, reset), strict=True))
    ours = [r for r in rows if r["stage"] == "substring_dedup"]
    edits: dict[str, list] = {}
    for r in ours:
        if r["reason"] == "substring_dedup:edit:repeat":
            edits.setdefault(r["key"], []).append(json.loads(r["detail"]) | {"text": r["text"]})
    removed = {r["key"]: r for r in ours if r["reason"] == "substring_dedup:removed"}
    assert set(edits) | set(removed) == {k_ for k_, v in want.items() if v}
    texts = dict(docs)
    order = {k_: i for i, (k_, _) in enumerate(docs)}
    for key, recs in edits.items():
        recs.sort(key=lambda r: r["start"])
        _same_cuts([(r["token_start"], r["token_end"]) for r in recs], want[key],
                   ids[order[key]], enc)
        kept = enc.decode(tokens[key].tolist())
        assert rebuild(kept, recs) == texts[key], key  # the original, from shard + records
        assert enc.encode_ordinary(kept) == tokens[key].tolist(), key  # real token pairs
    for key, r in removed.items():
        assert r["text"] == texts[key] and r["detail"].startswith("too_few_"), r
    rec = manifest["substring_dedup"]
    assert rec["documents_edited"] == len(edits) and rec["documents_removed"] == len(removed)
    assert rec["spans"] == sum(len(v) for v in edits.values())
    assert rec["tokens_in"] == sum(t.size for t in ids)
    kept_keys = set(tokens)
    assert kept_keys == {k_ for k_ in texts if k_ not in removed}
    return edits


@pytest.mark.slow
def test_run_cuts_repeated_spans_and_records_every_edit(tmp_path):
    _write_corpus(tmp_path / "data")
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"""
name: substr
tokenizer: gpt2
data_root: {tmp_path / 'data'}
block_documents: 10
sources:
  - {{name: a, path: a, license: cc0-1.0}}
  - {{name: b, path: b, license: cc0-1.0}}
substring_dedup: {{min_tokens: 20, scope: all, part_tokens: 2000}}
shards: {{tokens_per_shard: 100000, val_fraction: 0.0}}
""")
    out = tmp_path / "out"
    r = _run(["run", str(mix), "-q", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert "substring_dedup" in r.stdout
    edits = _check_run(out, ["a", "b"], 20, "all")
    manifest = json.loads((out / "manifest.json").read_text())
    # spans found across parts: the stage's tokens fill more than 2 parts of 2,000
    assert manifest["substring_dedup"]["tokens_in"] > 3 * 2000
    assert "parts" not in manifest["substring_dedup"]  # how the work was cut: not recorded
    assert len(edits) >= 20 and "a/docs.jsonl#000000007" in edits
    assert "a/docs.jsonl#000000005" in {r["key"] for r in run_outputs(out)[1]
                                       if r["reason"] == "substring_dedup:removed"}
    report = (out / "report.html").read_text()
    assert "Edited documents" in report and "<del>" in report
    # the n-gram index over the shards counts the curated tokens: the boilerplate once
    idx = tmp_path / "idx"
    assert _run(["ngram", "build", str(out), "-o", str(idx), "-q"]).returncode == 0
    phrase = " you agree to the Terms of Use and Privacy"
    r = _run(["ngram", "count", str(idx), phrase])
    assert r.returncode == 0, r.stderr
    query = get_encoding("gpt2").encode_ordinary(phrase)
    stream = np.concatenate([t for _, t in _shard_streams(out)])
    brute = sum(1 for i in range(stream.size - len(query) + 1)
                if stream[i : i + len(query)].tolist() == query)
    assert int(re.search(r"count\s+([\d,]+)", r.stdout)[1].replace(",", "")) == brute == 1


def _shard_streams(out: Path):
    from tokenmill.manifests.schema import load_manifest
    from tokenmill.manifests.shards import read_tokens

    for sh in load_manifest(out).shards():
        yield sh.path, np.asarray(read_tokens(out / sh.path), np.int64)


@pytest.mark.slow
def test_run_on_shared_corpora_agrees_with_hashed_windows(tmp_path):
    root = corpora()
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"""
name: substr-shared
tokenizer: gpt2
data_root: {root}
licenses: {{allow: [odc-by, cc-by-sa-3.0]}}
block_documents: 500
sources:
  - {{name: c4, path: c4-en-sample}}
  - {{name: wiki, path: wikipedia-wikitext-sample}}
  - {{name: cc, path: cc-main-2019-sample, license: odc-by}}
substring_dedup: {{min_tokens: 50, scope: source, part_tokens: 300000}}
shards: {{tokens_per_shard: 1000000, val_fraction: 0.0}}
""")
    out = tmp_path / "out"
    r = _run(["run", str(mix), "-q", "-o", str(out)])
    assert r.returncode == 0, r.stderr
    edits = _check_run(out, ["c4", "wiki", "cc"], 50, "source")
    assert edits  # the web samples repeat boilerplate


def test_part_size_is_not_part_of_the_config_identity():
    """The suffix-array part size cuts the work, not what is cut: runs that differ only in
    it record the same config (and sha256) in their manifests; min_tokens changes it."""
    from tokenmill.pipeline.config import DatamixConfig

    def cfg(**substring) -> DatamixConfig:
        return DatamixConfig.model_validate({"name": "x", "sources": [{"name": "s",
                                             "path": "s/*.jsonl"}],
                                             "substring_dedup": substring})

    small, large = cfg(min_tokens=50, part_tokens=2000), cfg(min_tokens=50)
    assert small.content_dict() == large.content_dict()
    assert small.sha256() == large.sha256()
    assert "part_tokens" not in small.content_dict()["substring_dedup"]
    assert cfg(min_tokens=20).sha256() != large.sha256()


def test_part_size_is_not_part_of_the_stage_fingerprint():
    """What the stage computed is reused when only its part size changes."""
    from tokenmill.pipeline.dedup.substring import SubstringDedup

    assert SubstringDedup(part_tokens=1).fingerprint() == SubstringDedup().fingerprint()
    assert SubstringDedup(min_tokens=20).fingerprint() != SubstringDedup().fingerprint()


@pytest.mark.slow
def test_how_the_work_is_cut_leaves_every_output_byte_as_it_is(tmp_path):
    """`tokenmill run` with other block and part sizes writes the same manifest, shards
    and quarantine bytes; a rerun with another part size redoes no block."""
    from tests.conftest import final_files

    _write_corpus(tmp_path / "data")

    def run(name: str, blocks: int, part_tokens: int, out: Path) -> str:
        mix = tmp_path / f"{name}.yaml"
        mix.write_text(f"name: substr\ntokenizer: gpt2\ndata_root: {tmp_path / 'data'}\n"
                       f"block_documents: {blocks}\nsources:\n"
                       "  - {name: a, path: a, license: cc0-1.0}\n"
                       "  - {name: b, path: b, license: cc0-1.0}\n"
                       f"substring_dedup: {{min_tokens: 20, scope: all, "
                       f"part_tokens: {part_tokens}}}\n")
        r = _run(["run", str(mix), "-o", str(out), "--no-report", "--num-cpus", "1"])
        assert r.returncode == 0, r.stderr
        return r.stdout

    run("small", 10, 2000, tmp_path / "small")
    run("large", 100, 100_000_000, tmp_path / "large")
    small = final_files(tmp_path / "small")
    assert small == final_files(tmp_path / "large")
    assert json.loads(small["manifest.json"])["substring_dedup"]["spans"] > 0
    again = run("again", 10, 5000, tmp_path / "small")
    assert re.search(r"prepare (\d+)/\1\b", again), again
    assert final_files(tmp_path / "small") == small
