"""Readers: every supported format yields the same documents."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tokenmill.pipeline.readers import read_file
from tokenmill.pipeline.step import Document

ROWS = [{"text": "first doc", "url": "a"}, {"text": "second\ndoc", "url": "b"}]


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "d.json.gz", "d.jsonl.zst",
                                  "d.parquet", "d.json"])
def test_formats(tmp_path, name):
    p = tmp_path / name
    lines = b"\n".join(json.dumps(r).encode() for r in ROWS) + b"\n"
    if name.endswith(".gz"):
        p.write_bytes(gzip.compress(lines))
    elif name.endswith(".zst"):
        p.write_bytes(zstandard.ZstdCompressor().compress(lines))
    elif name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(ROWS), p)
    elif name.endswith(".json"):
        p.write_text(json.dumps(ROWS))
    else:
        p.write_bytes(lines)
    docs = list(read_file(tmp_path, name, "src"))
    assert all(isinstance(d, Document) for d in docs)
    assert [d.text for d in docs] == ["first doc", "second\ndoc"]
    assert docs[1].key == f"src/{name}#000000001"


def test_whole_file_and_rst(tmp_path):
    (tmp_path / "a.rst.txt").write_text("Title\n=====\n\nbody")
    (docs,) = list(read_file(tmp_path, "a.rst.txt", "s"))
    assert docs.text.startswith("Title") and docs.key == "s/a.rst.txt#000000000"


def test_parquet_without_text_column_names_file(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"body": "x"}]), tmp_path / "x.parquet")
    (bad,) = list(read_file(tmp_path, "x.parquet", "s"))
    assert bad.reason == "unreadable_file" and "x.parquet: no column 'text'" in bad.detail


def test_truncated_archive_keeps_rows_before_and_names_file(tmp_path):
    lines = b"".join(json.dumps({"text": f"document {i} " * 20}).encode() + b"\n"
                     for i in range(2000))
    data = gzip.compress(lines)
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    items = list(read_file(tmp_path, "t.jsonl.gz", "s"))
    *docs, last = items
    assert docs and all(isinstance(d, Document) for d in docs)
    assert last.reason == "unreadable_file" and "t.jsonl.gz" in last.detail
    assert f"stopped after {len(docs)} rows" in last.detail


def test_bom_is_not_part_of_the_first_row(tmp_path):
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n')
    assert [d.text for d in read_file(tmp_path, "b.jsonl", "s")] == ["first", "second"]
