"""Readers: every supported format yields the same documents."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tokenmill.pipeline.read.readers import read_file
from tokenmill.pipeline.stage import Document, Rejection

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


def _lines(n: int) -> bytes:
    return b"".join(json.dumps({"text": f"document {i} " * 20}).encode() + b"\n"
                    for i in range(n))


def _compress(kind: str, data: bytes) -> bytes:
    import bz2
    import lzma

    return {"gz": gzip.compress, "zst": zstandard.ZstdCompressor().compress,
            "bz2": lambda d: bz2.compress(d, 1),  # 100 kB blocks
            "xz": lambda d: lzma.compress(d, preset=0)}[kind](data)


@pytest.mark.parametrize("kind", ["gz", "zst", "bz2", "xz"])
def test_truncated_archive_of_every_kind_is_detected(tmp_path, kind):
    import random

    rng = random.Random(0)  # incompressible rows, so the cut falls after many rows
    rows = b"".join(json.dumps({"text": " ".join(str(rng.random()) for _ in range(30))})
                    .encode() + b"\n" for _ in range(1000))
    data = _compress(kind, rows)
    if kind == "zst":  # several frames: a cut in a later frame keeps the earlier ones
        data = b"".join(_compress(kind, rows[i:i + 50_000])
                        for i in range(0, len(rows), 50_000))
    name = f"t.jsonl.{kind}"
    (tmp_path / name).write_bytes(data[: len(data) * 2 // 3])
    *docs, last = list(read_file(tmp_path, name, "s"))
    assert len(docs) > 100 and all(isinstance(d, Document) for d in docs)
    assert last.reason == "unreadable_file" and name in last.detail
    (tmp_path / name).write_bytes(data)
    assert len(list(read_file(tmp_path, name, "s"))) == 1000


def test_corrupt_gzip_and_misnamed_archives(tmp_path):
    data = bytearray(gzip.compress(_lines(50)))
    data[-6] ^= 0xFF  # the CRC32/size trailer
    (tmp_path / "c.jsonl.gz").write_bytes(bytes(data))
    assert list(read_file(tmp_path, "c.jsonl.gz", "s"))[-1].reason == "unreadable_file"
    (tmp_path / "plain.jsonl.gz").write_bytes(_lines(2))  # not compressed at all
    (bad,) = list(read_file(tmp_path, "plain.jsonl.gz", "s"))
    assert bad.reason == "unreadable_file" and "plain.jsonl.gz" in bad.detail
    (tmp_path / "zipped.jsonl").write_bytes(gzip.compress(_lines(3)))  # compressed, named plain
    assert len([d for d in read_file(tmp_path, "zipped.jsonl", "s")
                if isinstance(d, Document)]) == 3


def test_any_parser_failure_rejects_only_its_row(tmp_path):
    rows = [b'{"text": "first"}', b'{"text": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000
            + b"}", b'{"text": "big int", "n": ' + b"9" * 5000 + b"}",
            b'{"text": "big float", "n": 1e999999}', b'{"text": "last"}']
    (tmp_path / "r.jsonl").write_bytes(b"\n".join(rows))
    got = list(read_file(tmp_path, "r.jsonl", "s"))
    assert [g.reason if isinstance(g, Rejection) else g.text for g in got] == [
        "first", "invalid_json", "invalid_json", "big float", "last"]
    assert got[1].raw == rows[1] and got[2].raw == rows[2]
    assert "line 3" in got[2].detail


def test_json_layout_by_content_not_suffix(tmp_path):
    recs = [{"text": f"doc {i}"} for i in range(3)]
    layouts = {
        "lines.json": b"\n".join(json.dumps(r).encode() for r in recs),
        "pretty.json.gz": gzip.compress(json.dumps(recs, indent=2).encode()),
        "array.jsonl": json.dumps(recs).encode(),
        "dict.json": json.dumps({f"id{i}": r for i, r in enumerate(recs)}, indent=1).encode(),
        "dict1.json": json.dumps({f"id{i}": r for i, r in enumerate(recs)}).encode(),
        "strings.json.zst": zstandard.ZstdCompressor().compress(
            json.dumps([r["text"] for r in recs], indent=1).encode()),
        "bom.json": b"\xef\xbb\xbf" + json.dumps(recs, indent=1).encode(),
    }
    for name, data in layouts.items():
        (tmp_path / name).write_bytes(data)
        got = list(read_file(tmp_path, name, "s"))
        assert [d.text for d in got] == ["doc 0", "doc 1", "doc 2"], name
        assert got[2].key == f"s/{name}#000000002"
        assert [d.text for d in read_file(tmp_path, name, "s", skip=1)] == ["doc 1", "doc 2"]


def test_one_record_and_broken_layouts(tmp_path):
    (tmp_path / "one.json").write_text('{\n "text": "single record"\n}\n')
    assert [d.text for d in read_file(tmp_path, "one.json", "s")] == ["single record"]
    # JSON Lines whose first row is broken: the other rows are still read
    (tmp_path / "bad1.json").write_text('{"text": "cut\n{"text": "ok"}\n')
    got = list(read_file(tmp_path, "bad1.json", "s"))
    assert [type(g).__name__ for g in got] == ["Rejection", "Document"]
    # a pretty array broken in element 2: elements 0 and 1 kept, the file named
    (tmp_path / "arr.json").write_text('[\n{"text": "a"},\n{"text": "b"},\n{"text": \n')
    *docs, last = list(read_file(tmp_path, "arr.json", "s"))
    assert [d.text for d in docs] == ["a", "b"]
    assert last.reason == "unreadable_file" and "stopped after 2 rows" in last.detail


def test_undecodable_file_names_give_utf8_keys(tmp_path):
    import os

    name = os.fsdecode(b"caf\xe9.jsonl")
    (tmp_path / name).write_bytes(b'{"text": "x"}\n')
    (doc,) = list(read_file(tmp_path, name, "s"))
    assert doc.key == "s/caf\\xe9.jsonl#000000000"
    doc.key.encode("utf-8")  # valid UTF-8


def test_bom_in_every_format(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.txt").write_bytes(bom + b"hello")
    (tmp_path / "a.json").write_bytes(bom + b'["x", "y"]')
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(bom + b'{"text": "z"}\n'))
    assert [d.text for d in read_file(tmp_path, "a.txt", "s")] == ["hello"]
    assert [d.text for d in read_file(tmp_path, "a.json", "s")] == ["x", "y"]
    assert [d.text for d in read_file(tmp_path, "a.jsonl.gz", "s")] == ["z"]
