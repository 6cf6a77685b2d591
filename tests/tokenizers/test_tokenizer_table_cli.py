"""A tokenizer given as a ``tokenizer:`` table (a ranks file made in the test: GPT-2's
ranks with other ids) through the commands a user runs: curation, the n-gram index, a mix,
an export, the LEM precompute, legality tables and the trainer; the identity (version 2)
they record, a moved ranks file, and manifests written before version 2."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.shared import corpora
from tests.tokenizers.tokenizer_files import RENUMBERED, write_renumbered

REPO = Path(__file__).resolve().parents[2]


def tm(cwd: Path, *args: str, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    import os

    e = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DATA_ROOT"}  # mix's own
    e.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def _write_case(folder: Path, tokenizer) -> None:
    """src/: 80 c4 documents (card: odc-by); mix.yaml curating them with ``tokenizer``;
    spec.yaml: a training mix of them."""
    from tests.tokenizers.legality_corpus import iter_corpus_documents

    src = folder / "src"
    src.mkdir(parents=True)
    (src / "README.md").write_text("---\nlicense: odc-by\n---\n")
    docs = itertools.islice(iter_corpus_documents(corpora("c4-en-sample")), 80)
    (src / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for _, t in docs))
    (folder / "mix.yaml").write_text(yaml.safe_dump({
        "name": "table-tokenizer", "tokenizer": tokenizer, "data_root": ".",
        "licenses": {"allow": ["odc-by"]},
        "sources": [{"name": "s", "path": "src", "quality_filters": False}],
        "shards": {"val_fraction": 0.1}}, allow_unicode=True))
    (folder / "spec.yaml").write_text(yaml.safe_dump({
        "name": "tmix", "manifests": ["out/manifest.json"], "target_tokens": 30_000,
        "seed": 1, "sources": {"w": {"source": "s", "weight": 1.0, "max_epochs": 2}}}))


@pytest.fixture(scope="module")
def curated(tmp_path_factory) -> Path:
    """``tokenmill run`` of a datamix whose ``tokenizer:`` is the renumbered table (the
    ranks file in tok/, named relative to the datamix)."""
    f = tmp_path_factory.mktemp("table-run")
    table = write_renumbered(f / "tok")
    _write_case(f, {**table, "ranks": "tok/renumbered.tiktoken"})
    ok(tm(f, "run", "mix.yaml", "-o", "out", "--num-cpus", "1", "-q", "--no-report"))
    return f


@pytest.mark.slow
def test_curation_records_the_identity_and_tokenizes_with_the_table(curated):
    from tests.tokenizers.tokenizer_files import renumbered_ranks
    from tokenmill.manifests.shards import read_tokens
    from tokenmill.tokenizers.bpe_file import load_bpe_file

    man = json.loads((curated / "out" / "manifest.json").read_text())
    tok = man["tokenizer"]
    table = yaml.safe_load((curated / "tok" / "tokenizer.yaml").read_text())
    loaded = load_bpe_file(table, base_dir=curated / "tok")
    assert tok["version"] == 2 and tok["name"] == RENUMBERED
    assert tok["identity_sha256"] == loaded.identity_sha256
    assert tok["source"]["ranks"] == "tok/renumbered.tiktoken"  # as the datamix names it
    assert (tok["n_vocab"], tok["eot_token"]) == (50258, 50256)
    # the shards hold the table's ids: GPT-2's tokens with the byte tokens' ids reversed
    shards = [curated / "out" / s["path"] for src in man["sources"] for s in src["shards"]]
    ids = np.concatenate([np.asarray(read_tokens(p), np.int64) for p in shards])
    inv = {r: t for t, r in renumbered_ranks().items()}
    body = ids[ids != 50256]
    assert (body < 256).any()
    text = b"".join(inv[int(i)] for i in body).decode("utf-8", errors="replace")
    assert "the" in text and len(text) > 10_000


@pytest.mark.slow
def test_consumers_load_the_recorded_tokenizer(curated, tmp_path):
    """n-gram index and query, mix, export and its check read the table's identity; a
    moved ranks file is one line naming TOKENMILL_TOKENIZER_DIR, which finds it."""
    f = tmp_path / "c"
    shutil.copytree(curated, f)  # the recorded path is relative: the copy's file is used
    ok(tm(f, "ngram", "build", "out", "-o", "idx", "-q"))
    out = ok(tm(f, "ngram", "count", "idx", " the"))
    assert f"{RENUMBERED}@" in out and "count" in out
    ok(tm(f, "mix", "build", "spec.yaml", "-o", "mix.json"))
    mix = json.loads((f / "mix.json").read_text())
    man = json.loads((f / "out" / "manifest.json").read_text())
    assert mix["tokenizer"] == man["tokenizer"]
    ok(tm(f, "shards", "export", "--format", "megatron", "mix.json", "-o", "exp"))
    assert "OK" in ok(tm(f, "export", "verify", "exp"))
    assert json.loads((f / "exp" / "export.json").read_text())["tokenizer"] == man["tokenizer"]

    ranks = f / man["tokenizer"]["source"]["ranks"]
    moved = tmp_path / "moved"
    moved.mkdir()
    ranks.rename(moved / ranks.name)
    r = tm(f, "ngram", "count", "idx", " the")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "tok/renumbered.tiktoken" in lines[0] and "TOKENMILL_TOKENIZER_DIR" in lines[0]
    ok(tm(f, "ngram", "count", "idx", " the", TOKENMILL_TOKENIZER_DIR=str(moved)))


def test_a_table_that_cannot_be_used_is_one_line(tmp_path):
    write_renumbered(tmp_path / "tok")
    _write_case(tmp_path, {"name": "bad", "ranks": "tok/renumbered.tiktoken",
                           "pattern": r"\p{L}+", "special_tokens": {"<|endoftext|>": 5},
                           "eot": "<|endoftext|>"})
    r = tm(tmp_path, "run", "mix.yaml", "-o", "out", "--num-cpus", "1", "-q")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "special token '<|endoftext|>' has id 5" in lines[0]


def test_manifests_written_before_identity_version_2_are_still_read(tmp_path, monkeypatch):
    """A gpt2 curation whose manifest records the version-1 identity (name + ranks sha256,
    no version field) is validated, indexed and mixed (the CLI in this process, for
    speed); a drifted version-1 identity is still refused."""
    from tests.manifests.mixdata import write_curation
    from tokenmill.cli import main

    def here(cwd, *args):  # the same commands, in this process
        import contextlib
        import io

        monkeypatch.chdir(cwd)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
        return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())

    mpath = write_curation(corpora(), tmp_path / "out", "old", {"c4-en-sample": 60})
    man = json.loads(mpath.read_text())
    man["tokenizer"] = {k: man["tokenizer"][k]
                        for k in ("name", "ranks_sha256", "n_vocab", "eot_token")}
    mpath.write_text(json.dumps(man, indent=2))
    ok(here(tmp_path, "manifest", "validate", str(mpath)))
    ok(here(tmp_path, "ngram", "build", "out", "-o", "idx", "-q"))
    assert "gpt2@" in ok(here(tmp_path, "ngram", "count", "idx", " the"))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "old", "manifests": [str(mpath)], "target_tokens": 10_000, "seed": 1,
        "sources": {"w": {"source": "c4-en-sample", "weight": 1.0, "max_epochs": 2}}}))
    ok(here(tmp_path, "mix", "build", "spec.yaml", "-o", "mix.json"))
    drifted = {**man["tokenizer"], "ranks_sha256": "0" * 64}
    mpath.write_text(json.dumps({**man, "tokenizer": drifted}, indent=2))
    r = here(tmp_path, "ngram", "build", "out", "-o", "idx2", "-q")
    assert r.returncode == 2 and "gpt2@000000000000" in r.stderr, r.stderr


@pytest.mark.slow
def test_legality_lem_and_training_with_the_table(curated, tmp_path):
    """``legality build`` from the manifest, ``ngram lem`` of a mix and ``tokenmill train``
    with the legality mask and the prefix target, all on the table's tokenizer."""
    f = tmp_path / "c"
    shutil.copytree(curated, f)
    out = ok(tm(f, "legality", "build", "out/manifest.json", "-o", "tables", "-q"))
    assert f"{RENUMBERED}@" in out and "regex model            r50k" in out
    header = (f / "tables" / f"{RENUMBERED}.legality").read_bytes()[:4096]
    man = json.loads((f / "out" / "manifest.json").read_text())
    assert man["tokenizer"]["identity_sha256"].encode() in header
    ok(tm(f, "mix", "build", "spec.yaml", "-o", "mix.json"))
    ok(tm(f, "ngram", "lem", "mix.json", "-o", "lem", "--seq-len", "64", "--batch-size", "2",
          "-k", "2"))
    (f / "train.yaml").write_text(yaml.safe_dump({
        "data": "mix.json", "out_dir": "run", "model": "tiny", "seq_len": 64,
        "batch_size": 2, "steps": 4, "val_every": 2, "val_tokens": 256, "warmup_steps": 1,
        "device": "cpu", "num_threads": 1, "progress": False, "prefix_aux_weight": 0.1,
        "legality": f"tables/{RENUMBERED}.legality",
        "model_overrides": {"n_layer": 1, "n_embd": 64, "tie_embeddings": True}}))
    ok(tm(f, "train", "train.yaml", "-q"))
    metrics = json.loads((f / "run" / "metrics.json").read_text())
    assert metrics["steps_done"] == 4


def test_a_recorded_ranks_file_is_found_from_where_it_is_read(tmp_path, monkeypatch):
    """The identity records the ranks file as the datamix names it (relative, no absolute
    path); consumers find it from the working folder or beside the record, a moved one in
    TOKENMILL_TOKENIZER_DIR, and another file under its name is refused by its identity."""
    import base64

    from tokenmill.tokenizers import TokenizerMismatchError, check_identity, same_tokenizer
    from tokenmill.tokenizers.sources import load_source, load_spec
    from tokenmill.tokenizers.tiktoken_parts import encoding_parts

    proj = tmp_path / "proj"
    table = write_renumbered(proj / "tok")
    ident, _ = load_spec({**table, "ranks": "tok/renumbered.tiktoken"}, proj)
    assert ident.source.ranks == "tok/renumbered.tiktoken" and ident.version == 2
    record = proj / "out" / "manifest.json"
    record.parent.mkdir()
    record.write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert same_tokenizer(load_source(ident, str(record))[0], ident)  # beside the record
    # as consumers name the record in their messages (shards inspect, mix build, ...)
    assert same_tokenizer(load_source(ident, f"curation manifest {record}")[0], ident)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (proj / "tok" / "renumbered.tiktoken").rename(moved / "renumbered.tiktoken")
    with pytest.raises(ValueError, match="TOKENMILL_TOKENIZER_DIR") as e:
        load_source(ident, str(record))
    assert "\n" not in str(e.value) and "tok/renumbered.tiktoken" in str(e.value)
    monkeypatch.setenv("TOKENMILL_TOKENIZER_DIR", str(moved))
    assert same_tokenizer(load_source(ident, str(record))[0], ident)
    ranks = sorted(encoding_parts("gpt2").mergeable_ranks.items(), key=lambda kv: kv[1])
    (moved / "renumbered.tiktoken").write_bytes(  # GPT-2's own ids under the same name
        b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks))
    with pytest.raises(TokenizerMismatchError, match=str(record)) as e:
        check_identity(ident, load_source(ident, str(record))[0], str(record))
    assert f"TOKENMILL_TOKENIZER_DIR={moved}" in str(e.value)
    assert "TIKTOKEN_CACHE_DIR" not in str(e.value)
