"""The curated text as a Hugging Face parquet dataset (``tokenmill run --write-text``).

The dataset is written from the session's quickstart run into ``tmp_path`` (never into
the quickstart folder, whose files other tests compare byte for byte), loaded with
``datasets.load_dataset`` offline and compared with the shards decoded independently.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from tokenmill.manifests.shards import iter_documents
from tokenmill.manifests.verify import ShardVerifyError
from tokenmill.pipeline.report.hub_text import CARD_NAME, write_hub_text
from tokenmill.tokenizers import get_encoding


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _decoded(run) -> dict[str, dict[str, tuple[str, str]]]:
    """manifest split -> key -> (source, text), decoded straight from the shards."""
    enc = get_encoding(run.manifest.tokenizer.name)
    root = run.manifest_path.parent
    out: dict[str, dict[str, tuple[str, str]]] = {"train": {}, "val": {}}
    for src in run.manifest.sources:
        for shard in src.shards:
            for key, toks in iter_documents(root / shard.path):
                out[shard.split][key] = (src.name, enc.decode(toks[1:].tolist()))
    return out


@pytest.fixture(scope="module")
def hub_text(quickstart, tmp_path_factory):
    """The quickstart's text dataset, written once (one worker) outside its folder."""
    folder = tmp_path_factory.mktemp("hubtext") / "text"
    text = write_hub_text(quickstart.manifest_path.parent, folder, workers=1)
    assert not text.reused and text.folder == folder
    return text


@pytest.fixture
def offline_datasets(monkeypatch, tmp_path):
    """``datasets`` with the Hub switched off and its cache under ``tmp_path``."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    return datasets


def test_load_dataset_gives_the_shards_documents(quickstart, hub_text, tmp_path,
                                                 offline_datasets):
    def load(*args, **kw):
        return offline_datasets.load_dataset(str(hub_text.folder), *args,
                                             cache_dir=str(tmp_path / "hf-cache"), **kw)

    assert hub_text.documents == sum(s.counts.kept for s in quickstart.manifest.sources)
    truth = _decoded(quickstart)
    ds = load()
    assert set(ds) == {"train", "validation"}
    for hub, split in (("train", "train"), ("validation", "val")):
        rows = ds[hub]
        assert {"text", "key", "source", "license", "language", "n_tokens"} <= set(
            rows.column_names)
        got = {r["key"]: (r["source"], r["text"]) for r in rows}
        assert len(got) == rows.num_rows == len(truth[split])
        assert got == truth[split]
    enc = get_encoding("gpt2")
    row = ds["train"][0]
    assert row["n_tokens"] == len(enc.encode_ordinary(row["text"]))
    # one config per source, with the manifest's counts
    names = offline_datasets.get_dataset_config_names(str(hub_text.folder))
    assert names == ["default"] + [s.name for s in quickstart.manifest.sources]
    for src in quickstart.manifest.sources:
        if src.name not in ("c4-en-sample", "cc-main-2019-sample"):
            continue  # two sources: one with a validation split, one without
        one = load(name=src.name)
        assert one["train"].num_rows == src.documents["train"]
        assert ("validation" in one) == (src.documents.get("val", 0) > 0)
        assert set(one["train"]["source"]) == {src.name}
    cc = load(name="cc-main-2019-sample")["train"]
    assert "other" not in set(cc["license"])  # per-document licenses, not the marker


def test_card_names_licenses_sources_tokenizer_and_config(quickstart, hub_text):
    card = (hub_text.folder / CARD_NAME).read_text()
    assert card.startswith("---\n")
    header = yaml.safe_load(card.split("---\n")[1])
    m = quickstart.manifest
    names = [c["config_name"] for c in header["configs"]]
    assert names[0] == "default" and header["configs"][0]["default"] is True
    assert names[1:] == [s.name for s in m.sources if s.counts.kept > 0]
    assert {"odc-by", "mit", "psf-2.0", "cc-by-sa-3.0"} <= set(header["license"])
    assert m.config_sha256 in card and m.tokenizer.ranks_sha256 in card
    for src in m.sources:
        assert f"| {src.name} | {src.origin} |" in card


def test_text_files_are_deterministic_and_reused(quickstart, hub_text, tmp_path):
    out = quickstart.manifest_path.parent
    before = _files(hub_text.folder)
    b = write_hub_text(out, tmp_path / "b", workers=4)
    assert _files(tmp_path / "b") == before and b.files == hub_text.files
    again = write_hub_text(out, tmp_path / "b")
    assert again.reused and _files(tmp_path / "b") == before
    (tmp_path / "b" / b.files[-1]).unlink()  # an incomplete folder is rebuilt, same bytes
    assert not write_hub_text(out, tmp_path / "b").reused
    assert _files(tmp_path / "b") == before
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_a_corrupt_shard_is_refused_before_anything_is_written(quickstart, tmp_path):
    src = quickstart.manifest_path.parent
    copy = tmp_path / "out"
    copy.mkdir()
    shutil.copy(src / "manifest.json", copy / "manifest.json")
    shutil.copytree(src / "shards", copy / "shards")
    shard = copy / quickstart.manifest.sources[1].shards[0].path
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardVerifyError, match=shard.name):
        write_hub_text(copy)
    assert not (copy / "text").exists() and not list(copy.glob(".text.tmp-*"))


def test_run_write_text_flag_and_datamix_option(quickstart, tmp_path, monkeypatch, repo_root,
                                                capsys):
    """``tokenmill run --write-text`` (and ``write_text: true``) call the post-step on the
    run's output; the option does not change the config sha256 (nor the manifest)."""
    from tokenmill.cli import main
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.run import executor

    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(quickstart.manifest_path, out / "manifest.json")
    shutil.copytree(quickstart.manifest_path.parent / "shards", out / "shards")
    res = dataclasses.replace(quickstart, manifest_path=out / "manifest.json", output=str(out))
    monkeypatch.setattr(executor, "run_datamix", lambda *a, **kw: res)
    yml = repo_root / "manifests" / "quickstart.yaml"
    assert main(["run", str(yml), "-o", str(out), "-q", "--no-report"]) == 0
    assert not (out / "text").exists() and "text:" not in capsys.readouterr().out
    assert main(["run", str(yml), "-o", str(out), "-q", "--no-report", "--write-text"]) == 0
    assert (out / "text" / CARD_NAME).is_file()
    kept = sum(s.counts.kept for s in res.manifest.sources)
    assert f"text:     {out / 'text'} ({kept} documents" in capsys.readouterr().out
    opt = tmp_path / "with-text.yaml"
    opt.write_text(yml.read_text() + "write_text: true\n")
    assert main(["run", str(opt), "-o", str(out), "-q", "--no-report",
                 "--data-root", str(yml.parent)]) == 0
    assert ", unchanged;" in capsys.readouterr().out  # the option ran the step (reused)
    assert load_datamix(opt).sha256() == load_datamix(yml).sha256()
