"""Bad rows: each quarantined with its reason, every good row kept, no crash."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from tests.shared import corpora
from tokenmill.manifests.shards import iter_documents
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.run.executor import run_datamix
from tokenmill.tokenizers import get_encoding

GOOD = ["A perfectly ordinary document.", "Ünïcödé text with é and 中文 and emoji 🎉",
        "tabs\tand\nnewlines stay"]
LITERAL = "before <|endoftext|> after, a literal special token inside a document"


#: the datamix's row limit here (the default is 10 MB: a row over it costs seconds)
MAX_DOCUMENT_BYTES = 100_000


def _write_bad_source(root: Path) -> dict[int, str]:
    """A jsonl file mixing good rows and every kind of bad row. Returns row -> reason."""
    src = root / "badrows"
    (src / "data").mkdir(parents=True)
    (src / "README.md").write_text("---\nlicense: mit\n---\nbad rows for tests\n")
    lines: list[bytes] = []
    expect: dict[int, str] = {}

    def add(obj=None, raw: bytes | None = None, reason: str | None = None):
        if reason:
            expect[len(lines)] = reason
        lines.append(raw if raw is not None else json.dumps(obj).encode())

    add({"text": GOOD[0]})
    add({"content": "no text field here"}, reason="missing_text")
    add({"text": None}, reason="null_text")
    add({"text": 42}, reason="non_string_text:int")
    add(raw=b'{"text": "invalid \xff\xfe utf-8 bytes"}', reason="undecodable_bytes")
    add({"text": GOOD[1]})
    add({"text": ""}, reason="empty")
    add({"text": "w " * 100_000}, reason="too_large")  # 200 kB, over MAX_DOCUMENT_BYTES
    add({"text": LITERAL})
    add(raw=b'{"text": "\\ud800 lone surrogate"}', reason="invalid_unicode")
    add(raw=b'{"text": "truncated', reason="invalid_json")
    add({"text": GOOD[2]})
    add(["not", "an", "object"], reason="not_an_object")
    (src / "data" / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return expect


def test_bad_rows_are_quarantined_and_good_rows_kept(tmp_path):
    expect = _write_bad_source(tmp_path)
    cfg = DatamixConfig(
        name="bad", tokenizer="gpt2", data_root=str(tmp_path), output_dir=str(tmp_path / "out"),
        sources=[{"name": "badrows", "path": "badrows"},
                 {"name": "naughty", "path": str(corpora("naughty-strings"))}],
        shards={"val_fraction": 0.0}, max_document_bytes=MAX_DOCUMENT_BYTES,
    )
    res = run_datamix(cfg, num_cpus=1, progress=False)
    out = res.manifest_path.parent
    q = pq.read_table(out / "quarantine" / "badrows.parquet").to_pylist()
    got = {int(r["key"].rsplit("#", 1)[1]): r["reason"] for r in q}
    assert got == expect
    bad_bytes = next(r for r in q if r["reason"] == "undecodable_bytes")
    assert b"\xff\xfe" in bad_bytes["raw"] and "line 5" in bad_bytes["detail"]

    enc = get_encoding("gpt2")
    src = next(s for s in res.manifest.sources if s.name == "badrows")
    docs = {}
    for sh in src.shards:
        for key, toks in iter_documents(out / sh.path):
            docs[key] = toks
    texts = {enc.decode(t[1:].tolist()) for t in docs.values()}
    assert texts == {*GOOD, LITERAL}
    lit = next(t for t in docs.values() if enc.decode(t[1:].tolist()) == LITERAL)
    assert lit[0] == enc.eot_token
    assert enc.eot_token not in lit[1:].tolist(), "literal <|endoftext|> became the special id"
    assert src.counts.read == 13 and src.counts.kept == 4
    assert sum(src.counts.quarantined.values()) == len(expect)

    naughty = next(s for s in res.manifest.sources if s.name == "naughty")
    assert naughty.counts.kept > 450  # nothing crashed; only empties and duplicates went
    assert set(naughty.counts.quarantined) <= {"empty", "invalid_unicode"}
    assert naughty.counts.read == naughty.counts.kept + naughty.counts.removed()


def test_files_that_yield_nothing_and_truncated_archives(tmp_path):
    """An empty file, a file whose every row is removed, a copy of another file and a
    truncated archive: the run goes on and each removal is accounted for."""
    import gzip

    src = tmp_path / "edge"
    (src / "data").mkdir(parents=True)
    (src / "README.md").write_text("---\nlicense: mit\n---\n")
    rows = b"".join(json.dumps({"text": f"document number {i} with some words"}).encode()
                    + b"\n" for i in range(50))
    (src / "data" / "a.jsonl").write_bytes(rows)
    (src / "data" / "b.jsonl").write_bytes(rows)  # every row an exact duplicate of a.jsonl
    (src / "data" / "empty.jsonl").write_bytes(b"")
    (src / "data" / "blank.jsonl").write_bytes(b'{"text": ""}\n{"text": "  "}\n')
    gz = gzip.compress(rows * 200)
    (src / "data" / "trunc.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    (src / "data" / "notes.csv").write_text("a,b\n")
    cfg = DatamixConfig(name="edge", data_root=str(tmp_path), output_dir=str(tmp_path / "out"),
                        sources=[{"name": "edge", "path": "edge"}], shards={"val_fraction": 0.0})
    res = run_datamix(cfg, num_cpus=1, progress=False)
    (s,) = res.manifest.sources
    assert s.skipped_files == ["data/notes.csv"]
    assert s.counts.read == s.counts.kept + s.counts.removed()
    assert s.counts.kept == 50 and s.counts.exact_duplicates >= 50
    assert s.counts.quarantined["unreadable_file"] == 1
    assert s.counts.quarantined["empty"] == 2
    q = pq.read_table(tmp_path / "out" / "quarantine" / "edge.parquet").to_pylist()
    bad = next(r for r in q if r["reason"] == "unreadable_file")
    assert "trunc.jsonl.gz" in bad["detail"]
    dup = next(r for r in q if r["stage"] == "exact_dedup")
    assert dup["text"] and dup["duplicate_of"].startswith("edge/data/a.jsonl#")


def test_removed_source_leaves_no_shards_behind(tmp_path):
    from tokenmill.manifests.validate import validate_manifest

    two = DatamixConfig(name="x", data_root=str(corpora()), output_dir=str(tmp_path / "out"),
                        sources=[{"name": "books", "path": "books-public-domain"},
                                 {"name": "naughty", "path": "naughty-strings"}])
    run_datamix(two, num_cpus=1, progress=False)
    one = two.model_copy(update={"sources": two.sources[:1]})
    res = run_datamix(one, num_cpus=1, progress=False)
    out = tmp_path / "out"
    assert not (out / "shards" / "naughty").exists()
    assert not (out / "quarantine" / "naughty.parquet").exists()
    assert validate_manifest(res.manifest_path) == []
    stray = out / "shards" / "books" / "books_train_000099.bin"
    stray.write_bytes((out / res.manifest.shards()[0].path).read_bytes())
    (problem,) = validate_manifest(res.manifest_path)
    assert "books_train_000099.bin: shard file not in the manifest" in problem
