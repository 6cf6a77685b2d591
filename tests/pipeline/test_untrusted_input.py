"""Untrusted files in a source folder: links out of it, dataset cards that expand without
bound, rows and archives that do; a named text column; file names with control characters.
The commands that refuse before any work (a card bomb, a locked folder, a path out of the
data root) are run as a user runs them."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline.casecli import case_copy, one_line, py, run_case
from tokenmill.pipeline.read.links import walk_files
from tokenmill.pipeline.read.readers import printable_name, read_file

CARD = "---\nlicense: mit\n---\n"


def _datamix(folder: Path, **source: object) -> Path:
    src = {"name": "s", "path": "src", "quality_filters": False} | source
    (folder / "mix.yaml").write_text(
        "name: t\ntokenizer: gpt2\ndata_root: .\nlicenses: {allow: [mit]}\n"
        f"sources:\n  - {json.dumps(src)}\n"
        "shards: {tokens_per_shard: 100000, val_fraction: 0.0}\n")
    return folder / "mix.yaml"


def test_links_out_of_the_folder_are_skipped_at_any_depth(tmp_path):
    root = tmp_path / "src"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.jsonl").write_text('{"text": "kept"}\n')
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink("/etc/passwd", root / "passwd.txt")
    os.symlink(tmp_path / "outside.txt", root / "sub" / "deeper" / "x.txt")
    os.symlink("../../a.jsonl", root / "sub" / "deeper" / "alias.jsonl")  # inside: read
    os.symlink("/etc", root / "sub" / "etc")  # a folder outside
    os.symlink("..", root / "sub" / "up")  # a folder inside: a loop if followed
    os.symlink("nowhere", root / "broken.txt")
    os.symlink("l2", root / "l1.txt")
    os.symlink("l1.txt", root / "l2")
    os.symlink(root / "sub" / "deeper" / "x.txt", root / "chain.txt")  # a chain out
    files, skipped = walk_files(root)
    assert files == ["a.jsonl", "sub/deeper/alias.jsonl"]
    why = {s.rel: (s.target, s.why) for s in skipped}
    assert why["passwd.txt"] == ("/etc/passwd", "outside the source folder")
    assert why["chain.txt"][0] == str((tmp_path / "outside.txt").resolve())
    assert why["sub/etc"][1] == why["sub/deeper/x.txt"][1] == "outside the source folder"
    assert why["broken.txt"][1].startswith("broken") and "loop" in why["l1.txt"][1]
    assert "sub/up" not in why  # a folder inside is listed at its own path, quietly
    files, skipped = walk_files(root, allowed=(tmp_path,))  # e.g. a Hub cache's blobs
    assert "sub/deeper/x.txt" in files and "chain.txt" in files


def test_a_long_line_or_archive_is_cut_and_quarantined_as_too_large(tmp_path, monkeypatch):
    from tokenmill.pipeline.read import readers

    monkeypatch.setattr(readers, "MAX_VALUE_BYTES", 10_000_000)
    with gzip.open(tmp_path / "bomb.jsonl.gz", "wb") as f:
        f.write(b"a" * 5_000_000 + b'\n{"text": "after"}\n')
    got = list(read_file(tmp_path, "bomb.jsonl.gz", "s", max_document_bytes=1000))
    assert [getattr(g, "reason", None) for g in got] == ["too_large", None]
    assert len(got[0].raw) <= 1_000_000 and "over 5,000,001 bytes" in got[0].detail
    with gzip.open(tmp_path / "arr.json.gz", "wb") as f:
        f.write(b"[" + b" " * 20_000_000 + b"]")
    (bad,) = read_file(tmp_path, "arr.json.gz", "s", max_document_bytes=1000)
    assert bad.reason == "too_large" and "once decompressed" in bad.detail


def test_control_characters_in_file_names_are_escaped():
    assert printable_name("a\nb\x1b[1m\u2028.txt") == "a\\nb\\x1b[1m\\u2028.txt"
    assert printable_name("café.txt") == "café.txt"


def test_card_bomb_is_one_line_naming_the_card(tmp_path):
    f = case_copy(tmp_path, "card-bomb")
    py(f, "make_input.py")
    r = run_case(f)
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert str(f / "src" / "README.md") in line and "too large or too deep" in line
    assert len(r.stderr) < 1000


def test_a_locked_output_folder_refuses_a_second_run(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text(CARD)
    (tmp_path / "src" / "a.jsonl").write_text('{"text": "one"}\n')
    _datamix(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / ".tokenmill.lock").write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "since": "now",
             "command": "tokenmill run first.yaml"}))
        r = run_case(tmp_path)
        assert r.returncode == 2
        line = one_line(r.stderr)
        assert f"pid {holder.pid}" in line and "first.yaml" in line
    finally:
        holder.kill()
        holder.wait()


def test_a_relative_path_out_of_the_data_root_is_refused(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    _datamix(tmp_path / "root", path="../elsewhere")
    r = run_case(tmp_path / "root")
    assert r.returncode == 2 and "outside the data root" in one_line(r.stderr)
    assert "absolute path" in r.stderr


def test_a_parquet_without_its_text_column_is_one_line_and_text_column_reads_it(tmp_path):
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.read.sources import SourceError, resolve_sources

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "README.md").write_text(CARD)
    pq.write_table(pa.table({"body": ["a review", "another"], "stars": [4, 5]}),
                   tmp_path / "src" / "r\nx.parquet")
    r = run_case(tmp_path) if _datamix(tmp_path) else None
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "r\\nx.parquet has no column 'text' (its columns: body, stars)" in line
    assert "text_column" in line
    cfg = load_datamix(_datamix(tmp_path, text_column="body"), data_root=str(tmp_path))
    (src,) = resolve_sources(cfg)
    docs = list(read_file(src.root, src.files[0], "s", cfg.sources[0].text_key))
    assert [d.text for d in docs] == ["a review", "another"]
    with pytest.raises(ValueError, match="give one of them"):
        load_datamix(_datamix(tmp_path, text_column="body", text_field="text"))
    assert SourceError  # the class the one line comes from
