"""The reader and filter cases of ``../shared/cases``, copied under ``tests/pipeline/cases``.

Each expected value is the one in the cases' README table. The readers are checked file by
file (fast, no Ray); one end-to-end run curates every case source together and checks the
manifest counts and the quarantine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.read.readers import read_file
from tokenmill.pipeline.stage import Document, Rejection

CASES = Path(__file__).parent / "cases"


def _read(case: str, src: str = "src") -> dict[str, list]:
    """rel path → items (Documents with normalized text, Rejections) of every data file."""
    root = CASES / case / src
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.endswith("README.md"):
            items = list(read_file(root, rel, "s"))
            for it in items:
                if isinstance(it, Document):
                    it.text = normalize_text(it.text)
            out[rel] = items
    return out


def _docs(items: list) -> list[str]:
    return [d.text for d in items if isinstance(d, Document)]


def test_zst_trunc_every_truncated_archive_is_an_unreadable_file_naming_the_row():
    got = _read("zst-trunc")
    for rel in ("part-a.jsonl.zst", "part-b.jsonl.zst", "part-c.jsonl.gz"):
        *docs, last = got[rel]
        assert all(isinstance(d, Document) for d in docs)
        assert isinstance(last, Rejection) and last.reason == "unreadable_file", rel
        assert rel in last.detail and f"stopped after {len(docs)} rows" in last.detail
        assert last.key.endswith(f"#{len(docs):09d}")
    assert len(_docs(got["part-c.jsonl.gz"])) == 193  # the rows before the cut are kept


def test_ctrl_glue_separators_become_newlines():
    got = _read("ctrl-glue")
    (report,) = _docs(got["report.txt"])
    assert "here.\nPage two" in report and "continues.\nPage three" in report
    rows = _docs(got["rows.jsonl"])
    assert rows == ["First line of a Mac file\nSecond line of a Mac file\nThird line",
                    "Column heading\nvalue under the heading",
                    "Mainframe record one\nMainframe record two"]


@pytest.mark.parametrize("sep", ["\r", "\r\n", "\x0b", "\x0c", "\x85", "\u2028", "\u2029"])
def test_every_line_separator_is_one_newline(sep):
    assert normalize_text(f"one{sep}two") == "one\ntwo"
    assert normalize_text("keep\ttab\x00\x07gone") == "keep\ttabgone"


def test_bom_is_skipped_in_every_format():
    got = _read("bom")
    counts = {rel: len(_docs(items)) for rel, items in got.items()}
    assert counts == {"export.json": 4, "notes.txt": 1, "lines.jsonl": 2}
    assert all(isinstance(d, Document) for items in got.values() for d in items)
    assert not any(t.startswith("\ufeff") for items in got.values() for t in _docs(items))


def test_deep_nest_row_is_quarantined_with_its_bytes_and_the_rest_kept():
    items = _read("deep-nest")["tables.jsonl"]
    bad = [r for r in items if isinstance(r, Rejection)]
    assert [r.reason for r in bad] == ["invalid_json"]
    assert bad[0].key.endswith("#000000001") and bad[0].raw.startswith(b'{"text"')
    assert len(_docs(items)) == 5


@pytest.mark.parametrize("folder", ["lines-named-json", "array-gzipped", "dict-of-records"])
def test_json_layouts_are_detected_by_content(folder):
    (items,) = _read("json-layouts", f"data/{folder}").values()
    assert all(isinstance(d, Document) for d in items)
    assert len(items) == 3 and items[2].text.startswith("A third document")


def test_json_lines_named_json():
    (items,) = _read("json-lines-named-json").values()
    assert len(_docs(items)) == 5 and len(items) == 5


def test_parquet_binary_text_is_utf8(tmp_path):
    (items,) = _read("parquet-binary").values()
    assert _docs(items)[0] == ("Impala wrote this review 0: the café was lovely and the "
                               "staff friendly.")
    assert len(_docs(items)) == 4
    import pyarrow as pa

    bad = pa.table({"text": pa.array([b"ok \xc3\xa9", b"bad \xff\xfe", None], pa.binary())})
    pq.write_table(bad, tmp_path / "b.parquet")
    got = list(read_file(tmp_path, "b.parquet", "s"))
    assert got[0].text == "ok é"
    assert got[1].reason == "undecodable_bytes" and got[1].raw == b"bad \xff\xfe"
    assert got[2].reason == "null_text"


def _case_sources(tmp_path: Path) -> list[dict]:
    shutil.copytree(CASES, tmp_path / "cases")
    srcs = [{"name": c, "path": f"cases/{c}/src", "quality_filters": False}
            for c in ("zst-trunc", "ctrl-glue", "bom", "deep-nest", "json-lines-named-json",
                      "parquet-binary")]
    srcs += [{"name": f, "path": f"cases/json-layouts/data/{f}", "quality_filters": False}
             for f in ("lines-named-json", "array-gzipped", "dict-of-records")]
    for s in srcs:  # the case folders' cards say mit
        assert (tmp_path / s["path"] / "README.md").exists()
    return srcs


def test_cases_end_to_end(tmp_path):
    """Every reading case in one run: exit without error, counts as in the README table."""
    from tokenmill.pipeline.config import DatamixConfig
    from tokenmill.pipeline.run.executor import run_datamix

    cfg = DatamixConfig(name="cases", tokenizer="gpt2", data_root=str(tmp_path),
                        output_dir=str(tmp_path / "out"), licenses={"allow": ["mit"]},
                        sources=_case_sources(tmp_path), shards={"val_fraction": 0.0})
    res = run_datamix(cfg, num_cpus=1, progress=False)
    counts = {s.name: s.counts for s in res.manifest.sources}
    assert counts["zst-trunc"].quarantined == {"unreadable_file": 3}
    assert counts["zst-trunc"].kept == 193
    assert counts["ctrl-glue"].kept == 4 and not counts["ctrl-glue"].quarantined
    assert counts["bom"].kept == 7 and not counts["bom"].quarantined
    assert counts["deep-nest"].kept == 5
    assert counts["deep-nest"].quarantined == {"invalid_json": 1}
    assert counts["json-lines-named-json"].kept == 5
    assert counts["parquet-binary"].kept == 4 and not counts["parquet-binary"].quarantined
    for f in ("lines-named-json", "array-gzipped", "dict-of-records"):
        # "docs in" counts documents; the three sources hold the same 3 texts
        assert counts[f].read == 3 and "read_rejected" not in counts[f].quarantined
    assert sum(counts[f].kept for f in ("lines-named-json", "array-gzipped",
                                         "dict-of-records")) == 3
    out = tmp_path / "out"
    q = pq.read_table(out / "quarantine" / "zst-trunc.parquet").to_pylist()
    assert sorted(r["key"] for r in q) == ["zst-trunc/part-a.jsonl.zst#000000000",
                                           "zst-trunc/part-b.jsonl.zst#000000000",
                                           "zst-trunc/part-c.jsonl.gz#000000193"]


def test_stale_mtime_new_bytes_same_size_and_mtime_are_read_again(tmp_path):
    """Case stale-mtime: v2 of a file (same size, same mtime, new text) is curated again."""
    import os
    import runpy

    from tokenmill.manifests.shards import iter_documents
    from tokenmill.pipeline.config import DatamixConfig
    from tokenmill.pipeline.run.executor import run_datamix
    from tokenmill.tokenizers import get_encoding

    case = tmp_path / "case"
    (case / "src").mkdir(parents=True)
    (case / "src" / "README.md").write_text("---\nlicense: mit\n---\n")
    cfg = DatamixConfig(name="stale", tokenizer="gpt2", data_root=str(case),
                        output_dir=str(tmp_path / "out"), licenses={"allow": ["mit"]},
                        sources=[{"name": "s", "path": "src", "quality_filters": False}],
                        shards={"val_fraction": 0.0})
    enc = get_encoding("gpt2")
    texts = []
    for make in ("make_v1.py", "make_v2.py"):
        cwd = os.getcwd()
        os.chdir(case)
        try:
            runpy.run_path(str(CASES / "stale-mtime" / make))
        finally:
            os.chdir(cwd)
        res = run_datamix(cfg, num_cpus=1, progress=False)
        out = res.manifest_path.parent
        texts.append(sorted(enc.decode(t[1:].tolist()) for sh in res.manifest.shards()
                            for _, t in iter_documents(out / sh.path)))
    assert "Returns are accepted for 30 days." in texts[0]
    assert texts[1] == ["Returns are accepted for 60 days.", "The store opens at nine."]


def test_every_source_without_a_license_in_one_error(tmp_path):
    from tokenmill.pipeline.config import DatamixConfig
    from tokenmill.pipeline.read.sources import SourceError, resolve_sources

    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "d.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "c" / "README.md").write_text("---\nlicense: mit\n---\n")
    cfg = DatamixConfig(name="lic", data_root=str(tmp_path), output_dir=str(tmp_path / "o"),
                        sources=[{"name": n, "path": n} for n in ("a", "b", "c")])
    with pytest.raises(SourceError) as e:
        resolve_sources(cfg)
    msg = str(e.value)
    assert msg.startswith("no license for 2 sources: 'a' (no license in ") and "\n" not in msg
    assert "'b' (no license in " in msg and "'c'" not in msg
