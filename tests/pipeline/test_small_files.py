"""Many small row-format files are read in groups (one task and block per group), and a
grouped unit reads every row of every file in order, resuming across files."""

from __future__ import annotations

from tokenmill.pipeline.read.sources import ResolvedSource
from tokenmill.pipeline.run import executor
from tokenmill.pipeline.run.prepare_task import PrepareTask, prepare_unit


def _source(tmp_path, n: int) -> ResolvedSource:
    for i in range(n):
        (tmp_path / f"p{i:03d}.jsonl").write_text(
            "".join(f'{{"text": "file {i} row {r}"}}\n' for r in range(3)))
    (tmp_path / "big.jsonl").write_bytes(b'{"text": "x"}\n' * (executor.SMALL_FILE_BYTES // 14
                                                               + 1))
    files = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    return ResolvedSource(name="s", root=tmp_path, origin="s", revision=None, license="mit",
                          per_document_license=False, files=files)


def test_small_files_are_grouped_and_large_ones_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(executor, "GROUP_FILES", 20)
    src = _source(tmp_path, 50)
    groups = executor.row_groups(src, src.files)
    assert groups[0] == ["big.jsonl"] and [len(g) for g in groups[1:]] == [20, 20, 10]
    assert [f for g in groups for f in g] == src.files  # name order kept
    (tmp_path / "few").mkdir()
    few = _source(tmp_path / "few", 3)
    assert executor.row_groups(few, few.files) == [[f] for f in few.files]


def test_a_grouped_unit_reads_every_row_in_blocks(tmp_path):
    src = _source(tmp_path, 20)
    files = [f for f in src.files if f != "big.jsonl"]
    spec = PrepareTask(source="s", text_field="text", max_document_bytes=10_000, limit=None,
                       block_documents=7, work=str(tmp_path / "work"), root=str(tmp_path),
                       files=tuple(files), stages=(), globals=())
    res = prepare_unit(spec)
    assert [b["info"]["read"] for b in res["blocks"]] == [7] * 8 + [4]  # 60 rows
    per_file = {}
    for b in res["blocks"]:
        for rel, c in b["info"]["files"].items():
            per_file[rel] = per_file.get(rel, 0) + c["docs"]
    assert per_file == {f: 3 for f in files}
