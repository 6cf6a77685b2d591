"""Every case of ``tests/pipeline/cases`` through the command a user types: ``tokenmill run
mix.yaml -o out --num-cpus 1 -q`` as a subprocess from a copy of the case's folder, then
the case's own follow-up commands (its run.sh), each checked for the exit status and output
the cases' README expects. Outputs are read back with the cases' independent checker.
Each ``tokenmill run`` starts its own Ray: these tests are slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.casecli import case_copy, checker_load, env, one_line, py, run_case, tm

pytestmark = pytest.mark.slow


def _counts(man: dict, source: str = "s") -> dict:
    return next(s["counts"] for s in man["sources"] if s["name"] == source)


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr


def test_report_null_text(tmp_path):
    f = case_copy(tmp_path, "report-null-text")
    r = run_case(f)
    _ok(r)
    man, docs, q = checker_load(f / "out")
    assert len(docs) == 2 and [x["reason"] for x in q] == ["invalid_json"]
    assert (f / "out" / "report.html").is_file() and "report:" in r.stdout


def test_zst_trunc(tmp_path):
    f = case_copy(tmp_path, "zst-trunc")
    _ok(run_case(f))
    _, docs, q = checker_load(f / "out")
    bad = {x["key"].split("/", 1)[1].split("#")[0]: x for x in q
           if x["reason"] == "unreadable_file"}
    assert sorted(bad) == ["part-a.jsonl.zst", "part-b.jsonl.zst", "part-c.jsonl.gz"]
    for name, row in bad.items():
        assert name in row["detail"] and "stopped after" in row["detail"]
    assert (f / "out" / "report.html").is_file()


def test_deep_nest(tmp_path):
    f = case_copy(tmp_path, "deep-nest")
    _ok(run_case(f))
    _, docs, q = checker_load(f / "out")
    assert len(docs) == 5 and [x["reason"] for x in q] == ["invalid_json"]
    assert q[0]["key"].endswith("#000000001")


def test_ctrl_glue(tmp_path):
    f = case_copy(tmp_path, "ctrl-glue")
    _ok(run_case(f))
    text = "\n\n".join(checker_load(f / "out")[1].values())
    assert "here.\nPage two" in text and "file\nSecond" in text
    assert "headingvalue" not in text and "fileSecond" not in text


def test_bom(tmp_path):
    f = case_copy(tmp_path, "bom")
    _ok(run_case(f))
    _, docs, q = checker_load(f / "out")
    per_file = {}
    for key in docs:
        name = key.split("/", 1)[1].split("#")[0]
        per_file[name] = per_file.get(name, 0) + 1
    assert per_file == {"export.json": 4, "notes.txt": 1, "lines.jsonl": 2} and not q
    assert not any(t.startswith("\ufeff") for t in docs.values())


def test_json_layouts_and_json_lines_named_json(tmp_path):
    f = case_copy(tmp_path, "json-layouts")
    _ok(run_case(f))
    man, docs, _ = checker_load(f / "out")
    for name in ("lines-named-json", "array-gzipped", "dict-of-records"):
        c = _counts(man, name)  # quality filters are on here: read, not all kept
        assert c["read"] == 3 and not sum(c["quarantined"].values()), (name, c)
    g = case_copy(tmp_path, "json-lines-named-json")
    _ok(run_case(g))
    _, docs, q = checker_load(g / "out")
    assert len(docs) == 5 and not q


def test_parquet_binary(tmp_path):
    f = case_copy(tmp_path, "parquet-binary")
    _ok(run_case(f))
    _, docs, q = checker_load(f / "out")
    assert len(docs) == 4 and not q
    assert ("Impala wrote this review 0: the café was lovely and the staff friendly."
            in docs.values())


def test_stale_mtime(tmp_path):
    f = case_copy(tmp_path, "stale-mtime")
    py(f, "make_v1.py")
    _ok(run_case(f))
    py(f, "make_v2.py")
    r = run_case(f)
    _ok(r)
    assert "nothing to redo" not in r.stdout
    text = " ".join(checker_load(f / "out")[1].values())
    assert "60 days" in text and "30 days" not in text
    _ok(tm(f, "manifest", "validate", "out/manifest.json"))


def test_filters_keep_and_drop_as_the_reference(tmp_path):
    """filter-1..3 hold one document each (no datamix of their own): one datamix, one
    source per case, quality filters on."""
    for case in ("filter-1", "filter-2", "filter-3"):
        src = tmp_path / case
        src.mkdir()
        (src / "README.md").write_text("---\nlicense: mit\n---\n")
        case_copy(tmp_path / "copies", case)
        (src / "doc.txt").write_bytes((tmp_path / "copies" / case / "doc.txt").read_bytes())
    (tmp_path / "mix.yaml").write_text(
        "name: filters\ntokenizer: gpt2\ndata_root: .\nlicenses: {allow: [mit]}\nsources:\n"
        + "".join(f"  - {{name: {c}, path: {c}}}\n" for c in ("filter-1", "filter-2",
                                                                 "filter-3"))
        + "shards: {tokens_per_shard: 100000, val_fraction: 0.0}\n"
        + "quality: {gopher_quality: {}, fineweb: {}}\n")
    _ok(run_case(tmp_path))
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert _counts(man, "filter-1")["filtered"] == {}  # Gopher quality keeps it
    assert _counts(man, "filter-2")["filtered"] == {"fineweb:line_punct_ratio": 1}
    assert _counts(man, "filter-3")["filtered"] == {"gopher_quality:stop_words": 1}


def test_minhash_multicompare(tmp_path):
    f = case_copy(tmp_path, "minhash-multicompare")
    py(f, "make_input.py")
    _ok(run_case(f))
    man = json.loads((f / "out" / "manifest.json").read_text())
    assert _counts(man)["kept"] == 3000
    r = py(f, "verify.py", "out")
    assert r.stdout.startswith("fuzzy-removed: 0;"), r.stdout


def test_export_stale_shards(tmp_path):
    f = case_copy(tmp_path, "export-stale-shards")
    py(f, "make_input.py")
    _ok(run_case(f))
    _ok(tm(f, "mix", "build", "spec.yaml", "-o", "mix.json"))
    py(f, "make_input.py", "--edit")
    _ok(run_case(f))
    r = tm(f, "shards", "export", "--format", "modded-nanogpt", "mix.json", "-o", "exp")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "sha256" in r.stderr and "shards/s/" in r.stderr and "Traceback" not in r.stderr


def test_ngram_longest_fffd(tmp_path):
    f = case_copy(tmp_path, "ngram-longest-fffd")
    _ok(run_case(f))
    _ok(tm(f, "ngram", "build", "out", "-o", "idx", "-q"))
    r = tm(f, "ngram", "longest", "idx", "我喜欢吃苹", "-k", "3")
    _ok(r)
    assert "\ufffd" not in r.stdout and "matched text  '我喜欢吃苹'" in r.stdout
    assert "'\\xe6'" in r.stdout  # the next token, a byte fragment, shown as its byte


def test_symlink_out(tmp_path):
    f = case_copy(tmp_path, "symlink-out")
    py(f, "make_input.py")
    r = run_case(f)
    _ok(r)
    for link, target in (("passwd.txt", "/etc/passwd"), ("host.jsonl", "/etc/hostname")):
        assert any(link in ln and target in ln for ln in r.stderr.splitlines()), r.stderr
    man, docs, q = checker_load(f / "out")
    assert len(docs) == 1 and not q
    passwd = Path("/etc/passwd").read_text()[:40]
    host = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else "?"
    blob = b"".join(p.read_bytes() for p in (f / "out").rglob("*") if p.is_file()
                    and p.suffix in (".bin", ".parquet"))
    assert passwd.encode() not in blob and all(host not in t for t in docs.values())
    assert run_case(f, "mix.yaml", "out", "--strict").returncode == 2  # warnings are errors


def test_checkpoint_pickle(tmp_path):
    f = case_copy(tmp_path, "checkpoint-pickle")
    py(f, "make_input.py")
    _ok(run_case(f))
    _ok(tm(f, "mix", "build", "spec.yaml", "-o", "mix.json"))
    _ok(tm(f, "train", "train.yaml"))
    _ok(tm(f, "train", "train.yaml", "--resume", "--steps", "4"))  # our own checkpoints load
    py(f, "plant.py")
    r = tm(f, "train", "train.yaml", "--resume", "--steps", "6")
    assert r.returncode == 2
    assert "refused" in one_line(r.stderr) and "step_" in r.stderr
    assert not (f / "PWNED").exists()


def test_tokenizer_drift_every_consumer(tmp_path):
    f = case_copy(tmp_path, "tokenizer-drift")
    _ok(run_case(f))
    _ok(tm(f, "ngram", "build", "out", "-o", "idx", "-q"))
    py(f, "make_drift.py")
    drift = {"DRIFT_NOHASH": "1", "PYTHONPATH": str(f / "site"),
             "TIKTOKEN_CACHE_DIR": str(f / "tk-drift")}
    r = tm(f, "shards", "inspect", "out/shards/s/s_train_000000.bin", "--docs", "1", **drift)
    assert r.returncode == 2 and "committee" not in r.stdout
    line = one_line(r.stderr)
    want = json.loads((f / "out" / "manifest.json").read_text())["tokenizer"]["identity_sha256"]
    assert f"gpt2@{want[:12]}" in line and line.count("gpt2@") == 2
    for args in (["ngram", "count", "idx", " of the"], ["report", "out"],
                 ["ngram", "build", "out", "-o", "idx2", "-q"]):
        r = tm(f, *args, **drift)
        assert r.returncode == 2 and one_line(r.stderr).count("gpt2@") == 2, (args, r.stderr)
    r = tm(f, "run", "mix.yaml", "-o", "out", "--num-cpus", "1", "-q", "--strict", **drift)
    assert r.returncode == 2 and "refused under --strict" in one_line(r.stderr)


def test_two_datamixes_one_output(tmp_path):
    f = case_copy(tmp_path, "two-datamixes-one-output")
    py(f, "make_input.py")
    first = subprocess.Popen([sys.executable, "-m", "tokenmill.cli", "run", "mix_a.yaml", "-o",
                              "out", "--num-cpus", "1", "-q"], cwd=f, env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (f / "out" / ".tokenmill.lock").exists() and time.time() < deadline:
        time.sleep(0.2)
    second = run_case(f, "mix_b.yaml")
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0, err
    assert second.returncode == 2
    line = one_line(second.stderr)
    assert f"pid {first.pid}" in line and "mix_a.yaml" in line
    r = tm(f, "manifest", "validate", "out/manifest.json")
    _ok(r)
    assert json.loads((f / "out" / "manifest.json").read_text())["name"] == "two-a"
    assert not (f / "out" / ".tokenmill.lock").exists()


def test_disk_full(tmp_path):
    f = case_copy(tmp_path, "disk-full")
    py(f, "make_input.py")
    (f / "small").mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(f / "small")],
                           capture_output=True)
    if mount.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        r = run_case(f, "mix.yaml", "small/out")
        assert r.returncode == 2
        line = one_line(r.stderr)
        assert str(f / "small" / "out") in line and "disk full" in line
        subprocess.run(["cp", "-a", str(f / "small" / "out"), str(f / "big-out")])
    finally:
        subprocess.run(["umount", str(f / "small")])
    _ok(run_case(f, "mix.yaml", "big-out"))
