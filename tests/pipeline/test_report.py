"""The curation report (tokenmill.pipeline.report.curation_report) over a small real run folder.

The ``run_dir`` fixture builds what ``tokenmill run`` leaves behind from real corpora, with
the pipeline's stages (exact dedup by text, Gopher quality, FineWeb, language id, MinHash
fuzzy dedup), real gpt2 tokens written with ``write_shard`` (EOT before every document)
and a :class:`DatamixManifest`. It can be swapped for the pipeline's own output later.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline.dedup_oracle import fuzzy_dedup
from tests.shared import corpora
from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import (
    DatamixManifest,
    QuarantineEntry,
    ShardEntry,
    SourceCounts,
    SourceEntry,
    load_manifest,
)
from tokenmill.manifests.shards import sidecar_path, write_shard
from tokenmill.pipeline.dedup.minhash import jaccard_detail
from tokenmill.pipeline.document.language import LanguageFilter
from tokenmill.pipeline.document.measures import block_record
from tokenmill.pipeline.document.quality import FineWebQualityFilter, GopherQualityFilter
from tokenmill.pipeline.report.curation_report import document_waterfall, write_report
from tokenmill.pipeline.report.tuning import LICENSE_ROWS
from tokenmill.pipeline.run.stats import RunStats
from tokenmill.pipeline.stage import Document, DocumentStage, Rejection
from tokenmill.tokenizers import get_encoding, identity

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _texts(name: str) -> list[str]:
    out = []
    for f in sorted(corpora(name, "data").glob("*.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            out += [json.loads(line)["text"] for line in fh]
    return out


class _NearDuplicates(DocumentStage):
    """Fuzzy dedup over the whole stream (the single-process oracle), its removals
    quarantined as ``tokenmill run`` quarantines them."""

    name = "fuzzy_dedup"

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        docs = list(docs)
        removed = fuzzy_dedup([d.key for d in docs], [d.text for d in docs]).removed
        for d in docs:
            hit = removed.get(d.key)
            if hit is None:
                yield d
            else:
                self.reject(d, "fuzzy_dedup:duplicate", duplicate_of=hit[0],
                            detail=jaccard_detail(hit[1], True))


def _curate(source: str, texts: list[str], rejected: list[Rejection]):
    docs = [Document(key=f"{source}/data#{i:06d}", source=source, text=t)
            for i, t in enumerate(texts)]
    seen: dict[str, str] = {}
    unique = []
    exact = 0
    for d in docs:  # exact dedup by text (the pipeline's own stage does this for real)
        h = hashlib.sha256(d.text.encode("utf-8", "surrogatepass")).hexdigest()
        if h in seen:
            exact += 1
            rejected.append(Rejection(d.key, source, "exact_dedup", "exact_dedup:duplicate",
                                      text=d.text, duplicate_of=seen[h]))
        else:
            seen[h] = d.key
            unique.append(d)
    stages = [GopherQualityFilter(), FineWebQualityFilter(),
              LanguageFilter(languages=["en", "es", "de", "fr", "it"]), _NearDuplicates()]
    stream = iter(unique)
    for st in stages:
        st.sink = rejected.append
        stream = st(stream)
    kept = list(stream)
    counters = {"read": {"rows": len(docs)}, "exact_dedup": {"removed": exact}}
    counters.update({st.name: st.stats.to_dict() for st in stages})
    filtered = {}
    for st in stages:
        filtered.update(st.stats.rejected)
    counts = SourceCounts(read=len(docs), exact_duplicates=exact, filtered=filtered,
                          kept=len(kept))
    return kept, counts, counters, block_record(source, 0, stages)


def _build_run(out: Path, with_language: bool = True, with_quarantine: bool = True,
               with_measures: bool = True) -> Path:
    enc = get_encoding("gpt2")
    tok = identity("gpt2")
    (out / "shards").mkdir(parents=True)
    rejected: list[Rejection] = []
    sources = []
    c4 = _texts("c4-en-sample")[:150]
    # near-duplicates, as web crawls hold them: a few documents again with one word changed
    c4 += [re.sub(r"\bthe\b", "a", t, count=1) for t in c4[:40:4]]
    for name, texts, weight in (("c4", c4, 1.0),
                                ("cc", _texts("cc-main-2019-sample"), 0.5)):
        kept, counts, counters, measures = _curate(name, texts, rejected)
        if with_measures:  # the filters' per-block measure record, where a run keeps it
            rec = out / "work" / "measures" / name / "000000.json"
            rec.parent.mkdir(parents=True)
            rec.write_text(json.dumps(measures))
        ids = enc.encode_ordinary_batch([d.text for d in kept], num_threads=2)
        tokens = np.concatenate([np.r_[tok.eot_token, x] for x in ids]).astype(np.int64)
        offsets = np.cumsum([0] + [len(x) + 1 for x in ids[:-1]]).astype(np.uint64)
        path = out / "shards" / f"{name}_train_000000.bin"
        extra = None
        if with_language:
            extra = {"language": pa.array([d.metadata["language"] for d in kept]),
                     "language_score": pa.array([d.metadata["language_score"] for d in kept],
                                                pa.float32())}
        write_shard(path, tokens, 1, offsets, [d.key for d in kept], extra_columns=extra)
        shard = ShardEntry(path=str(path.relative_to(out)), split="train", version=1,
                           tokens=int(tokens.size), documents=len(kept),
                           sha256=sha256_file(path),
                           sidecar_sha256=sha256_file(sidecar_path(path)))
        sources.append(SourceEntry(
            name=name, origin=f"corpora/{name}", license="test", mixture_weight=weight,
            counts=counts, tokens={"train": int(tokens.size), "val": 0},
            documents={"train": len(kept), "val": 0}, shards=[shard], stages=counters))
    q_entries = []
    if with_quarantine:
        qdir = out / "quarantine"
        qdir.mkdir()
        qp = qdir / "all.parquet"
        cols = ("key", "source", "stage", "reason", "text", "duplicate_of", "detail")
        pq.write_table(pa.table({c: [getattr(r, c) for r in rejected] for c in cols}), qp)
        q_entries.append(QuarantineEntry(path="quarantine/all.parquet", rows=len(rejected),
                                         sha256=sha256_file(qp)))
    DatamixManifest(name="report-test", config={}, config_sha256="0" * 64, tokenizer=tok,
                    sources=sources, quarantine=q_entries).write(out)
    if with_measures:  # the stage times a run writes beside the manifest
        stats = RunStats.empty()
        for name, cpu in (("read", 0.5), ("gopher_quality", 2.0), ("prepare", 0.2),
                          ("fuzzy_dedup", 1.0), ("tokenize", 1.5)):
            stats.row(name).add(cpu, 200, 1_000_000)
        stats.wall_seconds, stats.cpus = 4.0, 2
        stats.write(out)
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _build_run(tmp_path_factory.mktemp("run"))


def _check_rendered(out: Path, res) -> list[str]:
    import matplotlib.image as mpimg

    html = res.html.read_text("utf-8")
    assert res.html == out / "report.html"
    referenced = re.findall(r"<img src='([^']+)'", html)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(referenced) == pngs == sorted(p.name for p in res.images)
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        img = mpimg.imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name
    # no network asset (the removed documents' excerpts may quote URLs as text)
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", html)
    return pngs


def test_report_renders_every_plot(run_dir):
    res = write_report(run_dir)
    pngs = _check_rendered(run_dir, res)
    assert pngs == sorted(["waterfall.png", "lengths.png", "removal_rates.png",
                           "rule_measures.png", "duplicate_clusters.png", "languages.png",
                           "mixture.png", "stage_times.png"])
    assert res.skipped == {}
    m = load_manifest(run_dir)
    stages, remaining = document_waterfall(m)
    print("stages:", stages, "remaining:", remaining)
    assert stages[0] == "read" and stages[-1] == "kept"
    assert stages[1:-1] == ["gopher_quality", "fineweb", "language", "exact_dedup",
                            "fuzzy_dedup"]
    for src in m.sources:
        row = remaining[src.name]
        assert row[0] == src.counts.read and row[-1] == src.counts.kept
        assert row[-2] == row[-1], "the stages account for every removal"
        assert all(a >= b for a, b in zip(row, row[1:], strict=False))
    assert all(remaining[s][-3] > remaining[s][-2] for s in ("c4",)), "fuzzy dedup removed"
    html = res.html.read_text("utf-8")
    assert "fuzzy_dedup" in html and "report-test" in html


def test_report_skips_missing_inputs(tmp_path):
    out = _build_run(tmp_path / "bare", with_language=False, with_quarantine=False,
                     with_measures=False)
    res = write_report(out)
    pngs = _check_rendered(out, res)
    assert "languages.png" not in pngs and "duplicate_clusters.png" not in pngs
    assert set(res.skipped) == {"languages.png", "duplicate_clusters.png",
                                "rule_measures.png", "stage_times.png"}
    assert "no language column" in res.html.read_text("utf-8")
    # rerun overwrites in place
    shutil.copy(out / "manifest.json", out / "manifest.bak")
    assert write_report(out).html.is_file()


def test_waterfall_from_executor_style_counters():
    """The main pipeline records heterogeneous stage counters and some removals only in
    ``counts``; the waterfall reconciles them to ``counts.kept``."""
    counts = SourceCounts(read=100, quarantined={"bad_utf8": 3}, license_rejected={"x": 2},
                          exact_duplicates=5, filtered={"too_few_words": 4}, kept=86)
    src = SourceEntry(name="s", origin="o", license="mit", mixture_weight=1.0, counts=counts,
                      tokens={"train": 10, "val": 0}, documents={"train": 86, "val": 0},
                      shards=[], stages={"read": {"rows": 100}, "exact_dedup": {"removed": 5},
                                         "length": {"rejected": {"too_few_words": 4}}})
    m = DatamixManifest(name="x", config={}, config_sha256="0" * 64, tokenizer=identity("gpt2"),
                        sources=[src], quarantine=[])
    stages, remaining = document_waterfall(m)
    assert stages == ["read", "quarantine", "license", "length", "exact_dedup", "kept"]
    assert remaining["s"] == [100, 97, 95, 91, 86, 86]


def test_report_needs_manifest(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path)


def _removals_run(out: Path) -> Path:
    """A run folder whose quarantine holds 7 documents of one filter reason (HTML in their
    text), per-document license removals of 3 variants in 2 families, a duplicate and an
    undecodable row."""
    long = "x" * 400
    rows = [Rejection(f"s/f#{i:03d}", "s", "gopher_quality", "gopher_quality:word_count",
                      text=f"<b>doc {i}</b> & {long}") for i in range(7)]
    rows += [Rejection(f"s/g#{i:03d}", "s", "license", lic, text=f"licensed {i}")
             for i, lic in enumerate(["license:cc-by-nc-4.0", "license:cc-by-nc-3.0-es",
                                      "license:cc-by-nd-4.0"])]
    rows += [Rejection("s/h#000", "s", "exact_dedup", "exact_dedup:duplicate", text="twin",
                       duplicate_of="s/f#000"),
             Rejection("s/r#000", "s", "read", "undecodable_bytes", raw=b"ab\xff<cd")]
    out.mkdir()
    (out / "quarantine").mkdir()
    qp = out / "quarantine" / "s.parquet"
    from tokenmill.pipeline.run.quarantine import to_table, write_quarantine

    write_quarantine(qp, to_table(rows))
    counts = SourceCounts(read=20, quarantined={"undecodable_bytes": 1},
                          license_rejected={"cc-by-nc-4.0": 1, "cc-by-nc-3.0-es": 1,
                                            "cc-by-nd-4.0": 1},
                          exact_duplicates=1, filtered={"gopher_quality:word_count": 7}, kept=8)
    src = SourceEntry(name="s", origin="o", license="other", mixture_weight=1.0,
                      counts=counts, tokens={"train": 10, "val": 0},
                      documents={"train": 8, "val": 0}, shards=[],
                      stages={"read": {"rows": 20}, "read_errors": {"removed": 1},
                              "license": {"docs_in": 19, "docs_out": 16, "rejected": {
                                  f"license:{k}": v for k, v in counts.license_rejected.items()}},
                              "gopher_quality": {"docs_in": 16, "docs_out": 9, "rejected": {
                                  "gopher_quality:word_count": 7}},
                              "exact_dedup": {"removed": 1}})
    DatamixManifest(name="removals", config={}, config_sha256="0" * 64,
                    tokenizer=identity("gpt2"), sources=[src],
                    quarantine=[QuarantineEntry(path="quarantine/s.parquet", rows=len(rows),
                                                sha256=sha256_file(qp))]).write(out)
    return out


@pytest.mark.parametrize("damage", [b"not parquet at all", None])
def test_a_corrupt_quarantine_file_is_named_in_one_line(tmp_path, capsys, damage):
    """A quarantine parquet that is not one (other bytes, or cut short): `tokenmill report`
    exits 2 with one line naming the file, no traceback."""
    from tokenmill.cli import main

    out = _removals_run(tmp_path / "run")
    qp = out / "quarantine" / "s.parquet"
    qp.write_bytes(damage if damage is not None else qp.read_bytes()[:-40])
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"tokenmill: {qp}: unreadable quarantine parquet file (")


def test_report_shows_examples_of_every_removal_reason(tmp_path):
    from tokenmill.pipeline.report import curation_report as report

    out = _removals_run(tmp_path / "run")
    html_text = write_report(out).html.read_text("utf-8")
    sections = re.findall(r"<details><summary><b>([^<]+)</b>: (\d+) removed(?:, (\d) shown)?"
                          r"</summary>(.*?)</details>", html_text, re.S)
    got = {label: (int(n), body.count("<pre>")) for label, n, _, body in sections}
    # every reason, in stage order; license variants by family; at most 5 examples each
    assert list(got) == ["read: undecodable_bytes", "license: cc-by-nc", "license: cc-by-nd",
                         "gopher_quality:word_count", "exact_dedup:duplicate"]
    assert got["gopher_quality:word_count"] == (7, 5)
    assert got["license: cc-by-nc"] == (2, 2)
    body = next(b for lab, _, _, b in sections if lab == "gopher_quality:word_count")
    # the first 300 characters, HTML-escaped: never the raw markup
    assert "<b>doc" not in html_text
    first = html.escape(f"<b>doc 0</b> & {'x' * 400}"[:300])
    assert f"<pre>{first}…</pre>" in body
    assert "s/f#005" not in body  # only the first five
    assert "duplicate of <code>s/f#000</code>" in html_text
    assert "ab\\xff&lt;cd" in html_text  # undecodable bytes shown escaped
    # the stage columns say what they count
    assert "<th class=l>source</th><th>rows read</th><th>after read errors</th>" in html_text
    assert "<th>after license</th>" in html_text and "<th>kept</th>" in html_text
    # license removals: families in the plot, the variants in a table
    labels = set(report._removal_rates(_report_of(out)))
    assert {"license: cc-by-nc", "license: cc-by-nd"} <= labels
    assert not any(lab.startswith("license:cc") for lab in labels)
    variants = re.search(r"Removed by per-document license</h3>(.*?)</table>", html_text,
                         re.S).group(1)
    assert variants.count("<tr>") == 4  # header + 3 variants
    assert "<td class=l>cc-by-nc</td><td class=l>cc-by-nc-3.0-es</td><td>1</td>" in variants


def _report_of(out: Path):
    from tokenmill.pipeline.report import curation_report as report

    m = load_manifest(out)
    stages, remaining = document_waterfall(m)
    return report._Report(out=out, manifest=m, result=report.ReportResult(html=out / "x"),
                          q_rows=[], examples={}, sidecars={}, stages=stages,
                          remaining=remaining)


def test_quickstart_report_groups_license_removals(quickstart):
    """The quickstart's ~90 per-document license variants: a handful of family bars, the
    largest variants in the table and one "other" row for the rest, every reason with
    examples."""
    out = quickstart.manifest_path.parent
    res = write_report(out)
    html_text = res.html.read_text("utf-8")
    variants = re.search(r"Removed by per-document license</h3>(.*?)</table>", html_text,
                         re.S).group(1)
    cc = next(s for s in quickstart.manifest.sources if s.name == "cc-main-2019-sample")
    assert len(cc.counts.license_rejected) > 30
    assert variants.count("<tr>") == 1 + LICENSE_ROWS + 1
    rest = sorted(cc.counts.license_rejected.values(), reverse=True)[LICENSE_ROWS:]
    assert (f"<td class=l>other</td><td class=l>{len(rest)} more variants</td>"
            f"<td>{sum(rest):,}</td>") in variants
    summaries = re.findall(r"<summary><b>([^<]+)</b>", html_text)
    assert len([s for s in summaries if s.startswith("license:")]) <= 6
    filtered = {r for s in quickstart.manifest.sources for r in s.counts.filtered}
    assert filtered and filtered <= set(summaries)
    assert {"normalize: empty", "exact_dedup:duplicate", "fuzzy_dedup:duplicate"} <= \
        set(summaries)


@pytest.mark.slow  # two plot processes; every plot drawn: test_report_renders_every_plot
def test_plot_workers_draw_the_same_files(run_dir, tmp_path):
    """`tokenmill run` draws the plots in worker processes started before the pipeline
    (matplotlib loaded while it runs); the files are byte-identical to drawing them here,
    the HTML too, and a second report gives the same bytes (deterministic)."""
    from tokenmill.pipeline.report.plots import PlotWorkers

    serial = tmp_path / "serial"
    shutil.copytree(run_dir, serial)
    res = write_report(serial)
    files = {p.name: p.read_bytes() for p in [*res.images, res.html]}
    assert len(res.images) == 8
    with PlotWorkers(2) as workers:
        par = write_report(run_dir, load_manifest(run_dir), workers=workers)
    _check_rendered(run_dir, par)
    assert {p.name: p.read_bytes() for p in [*par.images, par.html]} == files


def test_a_plot_drawn_ahead_is_waited_for_not_drawn_again(run_dir, tmp_path):
    """`tokenmill run` submits the rules plot while its last phases go on, drawn into the
    work folder; the report takes that drawing (its future), moves it into place and does
    not draw the plot itself."""
    from concurrent.futures import Future

    out = tmp_path / "out"
    shutil.copytree(run_dir, out)
    ahead = b"drawn ahead by a worker"
    early = out / "work" / "report-ahead" / "rule_measures.png"
    early.parent.mkdir(parents=True)
    early.write_bytes(ahead)
    done: Future = Future()
    done.set_result(str(early))
    res = write_report(out, drawn={"rule_measures.png": done})
    assert (out / "rule_measures.png").read_bytes() == ahead and not early.exists()
    assert out / "rule_measures.png" in res.images
    assert "<img src='rule_measures.png'" in res.html.read_text("utf-8")
    assert (out / "stage_times.png").read_bytes()[:8] == PNG_MAGIC  # the others drawn


_KILLED_OWNER = """
import os, sys
from tokenmill.pipeline.report.plots import PlotWorkers
if __name__ == "__main__":
    w = PlotWorkers(2).__enter__()
    w.submit(sys.argv[1], __import__("tokenmill.pipeline.report.plots", fromlist=["x"])
             .PlotSpec("m.png", "t", "c", "mixture", {"tokens": [1], "labels": ["a"]})).result()
    print(" ".join(map(str, w._pool._processes)), flush=True)
    os.kill(os.getpid(), 9)
"""


def test_plot_workers_end_with_a_killed_owner(tmp_path):
    """A `tokenmill run` killed by SIGKILL leaves no plot worker behind (pool workers
    would otherwise wait on their queue forever)."""
    import subprocess
    import sys
    import time

    script = tmp_path / "owner.py"
    script.write_text(_KILLED_OWNER)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "m.png")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9 and (tmp_path / "m.png").read_bytes()[:8] == PNG_MAGIC
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 2

    def running(pid: int) -> bool:  # exists and is not a zombie
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if running(p)]
    assert not alive, f"plot workers {alive} outlived their owner"


def test_removed_tokens_beyond_the_budget_are_sampled_then_estimated(run_dir, monkeypatch):
    """Encoding every removed document would dominate the report's time on a large run
    (20 of 27 s on the 233 MB bench run). Beyond the byte budget a systematic sample per
    (source, stage) is encoded (those counts exact) and the rest estimated from their bytes;
    the captions say so. Under the budget every count is exact and no caption changes."""
    from tokenmill.pipeline.report import curation_report as report

    m = load_manifest(run_dir)
    quarantine = report._read_quarantine(run_dir, m)
    exact_rows, _ = report._quarantine_rows(quarantine)
    assert report._count_tokens(exact_rows, quarantine, m) == ""
    enc = get_encoding(m.tokenizer.name)
    texts = quarantine.column("text").to_pylist()
    assert [r["n_tokens"] for r in exact_rows] == [
        len(enc.encode_ordinary(t)) + 1 for t in texts]

    total = sum(len(t.encode()) for t in texts)
    rows, _ = report._quarantine_rows(quarantine)
    note = report._count_tokens(rows, quarantine, m, budget=-(-total // 4))
    assert note.startswith("Tokens of removed documents: ") and "(1 in 4 of each" in note
    groups = [(r["source"], r["stage"]) for r in rows]
    first = {g: groups.index(g) for g in set(groups)}
    cap = int(re.search(r"up to ([\d,]+) characters", note).group(1).replace(",", ""))
    whole = [i for i in first.values() if len(texts[i]) <= cap]
    assert whole
    for i in whole:  # each group's first row is in the sample: exact when encoded whole
        assert rows[i]["n_tokens"] == exact_rows[i]["n_tokens"]
    est = sum(r["n_tokens"] for r in rows)
    true = sum(r["n_tokens"] for r in exact_rows)
    assert abs(est / true - 1) < 0.15, (est, true)  # -9 % here; -0.6 % on the bench run
    assert [r["n_tokens"] for r in rows] != [r["n_tokens"] for r in exact_rows]

    monkeypatch.setattr(report, "TOKEN_COUNT_BUDGET", -(-total // 4))
    page = write_report(run_dir).html.read_text("utf-8")
    assert page.count(html.escape(note)) == 2  # the waterfall and the lengths captions


def test_sampled_token_count_encodes_a_bounded_amount_of_text(monkeypatch):
    """Large documents on the sampled rows (each group's first is always sampled) must
    not blow the budget: a sampled text is cut to max(256, budget // sampled rows)
    characters, and its tokens per byte still give the estimate."""
    from tokenmill.pipeline.report import curation_report as report

    encoded: list[int] = []

    def counter(_manifest):
        def count(texts: list[str]) -> list[int]:
            encoded.extend(len(t) for t in texts)
            return [len(t) // 4 + 1 for t in texts]  # 4 bytes a token, + EOT
        return count

    monkeypatch.setattr(report, "_token_counter", counter)
    texts, sources = [], []
    for g in range(20):  # 20 groups, each opening with a 100 KB document
        texts += ["x" * 100_000] + ["y" * 100] * 50
        sources += [f"s{g}"] * 51
    table = pa.table({"source": sources, "key": [f"k{i}" for i in range(len(texts))],
                      "stage": ["gopher_quality"] * len(texts),
                      "reason": ["word_count"] * len(texts), "text": texts})
    rows, _ = report._quarantine_rows(table)
    total = sum(len(t) for t in texts)
    budget = total // 10
    note = report._count_tokens(rows, table, None, budget=budget)
    assert note and sum(encoded) <= budget, (sum(encoded), budget)
    est = sum(r["n_tokens"] for r in rows)
    true = sum(len(t) // 4 + 1 for t in texts)
    assert abs(est / true - 1) < 0.05, (est, true)
