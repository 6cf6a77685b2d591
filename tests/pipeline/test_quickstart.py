"""End-to-end: the quickstart datamix over the real corpora."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from tests.shared import corpora
from tokenmill.manifests.shards import iter_documents, read_tokens
from tokenmill.manifests.validate import validate_manifest
from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.read.readers import read_file
from tokenmill.pipeline.read.sources import list_files
from tokenmill.pipeline.stage import Document, is_edit_reason
from tokenmill.tokenizers import get_encoding


def _normalized_texts(source: str, folder: Path) -> dict[str, str]:
    files = list_files(folder)
    out = {}
    for rel in files:
        for item in read_file(folder, rel, source):
            if isinstance(item, Document):
                out[item.key] = normalize_text(item.text)
    return out


def _with_edits(texts: dict[str, str], root: Path, manifest) -> dict[str, str]:
    """``texts`` with the quarantine's edit records (PII placeholders) applied."""
    edits = defaultdict(list)
    for q in manifest.quarantine:
        for row in pq.read_table(root / q.path).to_pylist():
            if is_edit_reason(row["reason"]):
                edits[row["key"]].append((json.loads(row["detail"]), row["text"]))
    out = dict(texts)
    for key, spans in edits.items():
        if key not in out:
            continue  # another source's document
        t = out[key]
        for d, original in sorted(spans, key=lambda s: -s[0]["start"]):
            assert t[d["start"]:d["end"]] == original, key
            t = t[:d["start"]] + d["replacement"] + t[d["end"]:]
        out[key] = t
    return out


def test_every_kept_document_decodes_to_its_normalized_text(quickstart):
    """... with the PII placeholders of its edit records: each original span is kept."""
    m = quickstart.manifest
    root = quickstart.manifest_path.parent
    assert validate_manifest(quickstart.manifest_path) == []
    enc = get_encoding("gpt2")
    checked = 0
    edited = sum(sum(s.pii_replacements.values()) for s in m.sources)
    assert edited > 0
    for src in m.sources:
        expected = _with_edits(_normalized_texts(src.name, corpora(src.origin)), root, m)
        n_docs = 0
        for shard in src.shards:
            for key, toks in iter_documents(root / shard.path):
                assert toks[0] == enc.eot_token, key
                assert enc.eot_token not in toks[1:].tolist(), key
                assert enc.decode(toks[1:].tolist()) == expected[key], key
                n_docs += 1
        assert n_docs == src.counts.kept == sum(src.documents.values())
        checked += n_docs
    assert checked > 1500
    # the per-document license gate removed nc/nd documents and counted them
    cc = next(s for s in m.sources if s.name == "cc-main-2019-sample")
    assert sum(cc.counts.license_rejected.values()) > 100
    assert all(("-nc" in k or "-nd" in k or k == "none") for k in cc.counts.license_rejected)
    assert {s.split for s in m.shards()} == {"train", "val"}


def test_no_two_kept_documents_are_exact_duplicates(quickstart):
    """Every exact-duplicate group (cc-main holds several) is reduced to one document,
    across the whole datamix; the removed ones are quarantined with their kept twin."""
    import pyarrow.parquet as pq

    root = quickstart.manifest_path.parent
    seen: dict[bytes, str] = {}
    for shard in quickstart.manifest.shards():
        for key, toks in iter_documents(root / shard.path):
            b = toks.tobytes()
            assert b not in seen, f"{key} duplicates {seen[b]}"
            seen[b] = key
    q = pq.read_table(root / "quarantine" / "naughty-strings.parquet").to_pylist()
    exact = [r for r in q if r["stage"] == "exact_dedup"]
    assert exact and all(r["duplicate_of"] in seen.values() for r in exact)
    near = [r for r in q if r["stage"] == "fuzzy_dedup"]
    assert all(r["duplicate_of"] and r["detail"].startswith("jaccard=") for r in near)
    assert all(float(r["detail"].split("=")[1].split()[0]) >= 0.8 for r in near)


def test_sidecars_carry_language_and_license(quickstart):
    from tokenmill.manifests.shards import read_sidecar

    root = quickstart.manifest_path.parent
    m = quickstart.manifest
    cc = next(s for s in m.sources if s.name == "cc-main-2019-sample")
    side = read_sidecar(root / cc.shards[0].path)
    assert {"language", "language_score", "license"} <= set(side.column_names)
    assert set(side.column("language").to_pylist()) == {"en"}
    books = next(s for s in m.sources if s.name == "books-public-domain")
    langs = read_sidecar(root / books.shards[0].path).column("language").to_pylist()
    assert "ja" in langs and "en" in langs  # labelled, not filtered
    assert m.fuzzy_dedup["params"]["num_perm"] == 128
    assert m.fuzzy_dedup["params"]["bands"] * m.fuzzy_dedup["params"]["rows"] <= 128


def _load_data_shard(file: Path) -> torch.Tensor:
    """modded-nanogpt's reader (train_gpt.py), verbatim in behaviour, pinning left out on CPU."""
    header = torch.from_file(str(file), False, 256, dtype=torch.int32)
    assert header[0] == 20240520, "magic number mismatch in the data .bin file"
    assert header[1] == 1, "unsupported version"
    num_tokens = int(header[2])
    with file.open("rb", buffering=0) as f:
        tokens = torch.empty(num_tokens, dtype=torch.uint16)
        f.seek(256 * 4)
        nbytes = f.readinto(tokens.numpy())
        assert nbytes == 2 * num_tokens, "number of tokens read does not match header"
    return tokens


def test_modded_nanogpt_reader_gets_the_same_tokens(quickstart):
    root = quickstart.manifest_path.parent
    for shard in quickstart.manifest.shards():
        theirs = _load_data_shard(root / shard.path).numpy()
        ours = np.asarray(read_tokens(root / shard.path))
        assert theirs.dtype == np.uint16 and theirs.shape == (shard.tokens,)
        np.testing.assert_array_equal(theirs, ours)


def test_rerun_reuses_every_unit(quickstart, tmp_path):
    from tests.conftest import run_quickstart_like

    out = tmp_path / "out"  # a copy: the shared quickstart folder is read-only for tests
    shutil.copytree(quickstart.manifest_path.parent, out)
    before = quickstart.manifest_path.read_bytes()
    res = run_quickstart_like(out, num_cpus=2)
    assert res.reused_units == res.total_units
    assert res.manifest_path.read_bytes() == before


def test_small_sources_get_a_validation_split(quickstart):
    """cc (39 kept), wiki (72) and books (3, its minimum set in the datamix) get val shards:
    the val_fraction hash gives them none, so the next documents in the same hash order
    move to val; the manifest states each source's minimum and how it was met."""
    from tokenmill.manifests.shards import read_sidecar
    from tokenmill.pipeline.run.tokenize import split_hash

    root = quickstart.manifest_path.parent
    by_name = {s.name: s for s in quickstart.manifest.sources}
    for name in ("cc-main-2019-sample", "wikipedia-wikitext-sample", "books-public-domain"):
        src = by_name[name]
        v = src.validation
        assert [sh.split for sh in src.shards].count("val") == 1, name
        assert v.min_documents == 1 and v.by_fraction == 0 and v.added == 1, (name, v)
        assert src.documents["val"] == 1 and src.documents["train"] == src.counts.kept - 1
        keys = {sh.split: read_sidecar(root / sh.path).column("key").to_pylist()
                for sh in src.shards}
        (val_key,) = keys["val"]
        assert split_hash(val_key) < min(split_hash(k) for k in keys["train"])
    c4 = by_name["c4-en-sample"].validation  # big enough: the fraction alone suffices
    assert c4.min_documents == 1 and c4.by_fraction > 1 and c4.added == 0
    assert quickstart.manifest.config["shards"]["min_val_documents"] == 1


def test_the_run_records_every_filter_rule_over_the_documents_reaching_it(quickstart):
    """The report's rule histograms come from the run itself: per source, the first rule
    of a quality filter saw exactly the documents that entered that filter (later rules,
    such as C4's sentence count, see those the earlier rules kept)."""
    from tokenmill.pipeline.document.measures import read_records

    records = read_records(quickstart.manifest_path.parent / "work" / "measures")
    checked = 0
    for src in quickstart.manifest.sources:
        for stage, rule in (("gopher_quality", "gopher_quality:word_count"),
                            ("gopher_repetition", "gopher_repetition:dup_line_frac")):
            if stage in src.stages:
                assert sum(records[src.name]["histograms"][rule]) == \
                    src.stages[stage]["docs_in"], (src.name, rule)
                checked += 1
    assert checked >= 4
    c4 = records["c4-en-sample"]["histograms"]["c4:too_few_sentences"]
    assert 0 < sum(c4) <= quickstart.manifest.sources[1].stages["c4"]["docs_in"]
