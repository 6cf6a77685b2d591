"""The fastText classifier: `tokenmill classifier train` on DCLM's human labels, and the
classifier stage (with PII and the URL filter) in a `tokenmill run`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.shared import corpora
from tests.tinymodel import train_tiny_model
from tokenmill.pipeline.classifier_train import roc_auc
from tokenmill.pipeline.document.classifier import ClassifierFilter, prepare_text
from tokenmill.pipeline.stage import Document, Rejection

REPO = Path(__file__).resolve().parents[2]


def _can_train() -> bool:
    import fasttext

    return hasattr(fasttext, "train_supervised")


needs_training = pytest.mark.skipif(not _can_train(), reason="the installed fasttext module "
                                    "cannot train (fasttext-predict): install fasttext-numpy2")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ))


def test_text_preparations():
    text = "  Line One\nLine\r\nTwo\u2028three \n"
    assert prepare_text(text, "dclm") == "Line One Line Two three"
    assert prepare_text(text, "lower") == "line one line two three"
    assert prepare_text(text, "none") == "  Line One Line\r Two\u2028three  "
    with pytest.raises(ValueError, match="unknown text_prep"):
        prepare_text(text, "bert")


def test_roc_auc_counts_ties_half():
    import numpy as np

    assert roc_auc(np.array([0.9, 0.1, 0.5, 0.5]), np.array([1, 0, 1, 0])) == 0.875


@needs_training
def test_classifier_stage_scores_and_quarantines(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("".join(f"__label__hq {w} science history essay\n__label__cc {w} buy "
                             "cheap click now\n" for w in ("a", "b", "c", "d") * 20))
    train_tiny_model(train, tmp_path / "m.bin", dim=16, bucket=10000, epoch=20)
    stage = ClassifierFilter(model=str(tmp_path / "m.bin"), label="hq", threshold=0.5,
                             digest="x")
    sink: list[Rejection] = []
    stage.sink = sink.append
    docs = [Document("s/f#0", "s", "a science\nhistory essay"),
            Document("s/f#1", "s", "buy cheap\nclick now")]
    kept = list(stage(docs))
    assert [d.key for d in kept] == ["s/f#0"] and kept[0].metadata["classifier_score"] > 0.5
    assert sink[0].reason == "classifier:below_threshold" and float(sink[0].detail) < 0.5
    with pytest.raises(ValueError, match="no label 'good'"):
        list(ClassifierFilter(model=str(tmp_path / "m.bin"), label="good", threshold=0.5)(docs))


def _labels(value: int) -> list[str]:
    d = corpora("dclm-quality-labels", "data")
    return [f"{d / name}:label={value}" for name in ("agreement_data.jsonl",
                                                     "majority_data.jsonl")]


def _train(model: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli("classifier", "train", "--positive", *_labels(1), "--negative", *_labels(0),
                "-o", str(model), "--bucket", "100000", *extra)


@pytest.mark.slow
@needs_training
def test_train_cross_validated_auc_and_run_with_all_three(tmp_path):
    model = tmp_path / "dclm-labels.bin"
    r = _train(model, "--cv")
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    mean = re.search(r"5-fold cross-validation, mean held-out: precision \S+  recall \S+  "
                     r"AUC (\S+)", r.stdout)
    base = re.search(r"5-fold cross-validation, mean held-out AUC of the heuristic filters' "
                     r"keep decision: (\S+)", r.stdout)
    assert mean and base, r.stdout
    assert float(mean.group(1)) >= 0.80
    assert 0.5 < float(base.group(1)) < float(mean.group(1))
    assert "held-out: precision" in r.stdout and model.is_file()
    # DCLM's 5 epochs leave the probabilities near 0.5 on so few documents: the model the
    # run uses trains longer, so that a threshold separates documents
    r = _train(model, "--epoch", "25")
    assert r.returncode == 0, r.stderr

    (tmp_path / "words.txt").write_text("blog\n")
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"""
name: classified
data_root: {corpora()}
licenses: {{allow: [odc-by]}}
sources:
  - {{name: c4, path: c4-en-sample, url_field: url, max_documents: 300}}
url_filter: {{banned_words: [words.txt]}}
classifier: {{model: {model.name}, label: hq, threshold: 0.55}}
pii: {{}}
shards: {{tokens_per_shard: 100000, val_fraction: 0.0}}
""")
    run = _cli("run", str(mix), "-q", "-o", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    [src] = manifest["sources"]
    filtered = src["counts"]["filtered"]
    assert filtered["classifier:below_threshold"] > 0
    assert filtered["url_filter:hard_blacklisted"] > 0
    assert src["pii_replacements"]["email"] > 0
    q = pq.read_table(out / manifest["quarantine"][0]["path"]).to_pylist()
    low = [row for row in q if row["reason"] == "classifier:below_threshold"]
    assert low and all(float(row["detail"]) < 0.55 for row in low)
    sidecars = sorted(out.rglob("*.parquet"))
    scores = [s for p in sidecars if "quarantine" not in p.parts and "work" not in p.parts
              for t in [pq.read_table(p)] if "classifier_score" in t.column_names
              for s in t.column("classifier_score").to_pylist()]
    assert len(scores) == src["documents"]["train"] and min(scores) >= 0.55


def test_training_needs_both_classes(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "fine words"}\n')
    r = _cli("classifier", "train", "--positive", str(good), "--negative",
             f"{good}:label=0", "-o", str(tmp_path / "m.bin"))
    assert r.returncode == 2 and r.stderr.startswith("tokenmill: ")
    assert "needs positive and negative documents" in r.stderr


def test_example_datamix_points_at_the_model_make_run_writes():
    from tokenmill.pipeline.config import load_datamix

    cfg = load_datamix(REPO / "manifests" / "quickstart-classifier.yaml")
    assert cfg.classifier is not None and cfg.classifier.label == "hq"
    assert cfg.resolve(cfg.classifier.model) == str(REPO / "out" / "models" / "dclm-labels.bin")
    assert "-o out/models/dclm-labels.bin" in (REPO / "Makefile").read_text()


@pytest.mark.slow
@needs_training
def test_top_fraction_keeps_the_best_scored_share_of_each_source(tmp_path):
    """... of each source the classifier scores (``classifier.sources``): the others keep
    every document."""
    model = tmp_path / "m.bin"
    assert _train(model, "--epoch", "25").returncode == 0
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"""
name: top
data_root: {corpora()}
licenses: {{allow: [odc-by, mit]}}
sources:
  - {{name: c4, path: c4-en-sample, max_documents: 200}}
  - {{name: naughty, path: naughty-strings}}
classifier: {{model: m.bin, label: hq, top_fraction: 0.25, sources: [c4]}}
shards: {{tokens_per_shard: 100000, val_fraction: 0.0}}
""")
    run = _cli("run", str(mix), "-q", "-o", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    src, other = manifest["sources"]
    assert src["counts"]["kept"] == 50 and src["counts"]["filtered"]["classifier_top"] == 150
    assert other["counts"]["kept"] > 0 and "classifier_top" not in other["counts"]["filtered"]
    q = pq.read_table(out / manifest["quarantine"][0]["path"]).to_pylist()
    removed = [float(r["detail"]) for r in q if r["reason"] == "classifier_top:removed"]
    kept = [s for p in sorted(out.rglob("*.parquet")) if "quarantine" not in p.parts
            and "work" not in p.parts for t in [pq.read_table(p)]
            if "classifier_score" in t.column_names
            for s in t.column("classifier_score").to_pylist()]
    assert len(removed) == 150 and len(kept) == 50 and min(kept) >= max(removed)


@needs_training
def test_a_damaged_model_stops_the_run_with_one_line(tmp_path):
    """A truncated model (fastText itself would score with it, wrongly) and one whose
    header claims a negative dimension (fastText runs out of memory): exit 2, one line
    naming the file."""
    model = tmp_path / "m.bin"
    assert _train(model).returncode == 0
    good = model.read_bytes()
    (tmp_path / "cut.bin").write_bytes(good[:len(good) - 100])
    (tmp_path / "dim.bin").write_bytes(good[:8] + (-1).to_bytes(4, "little", signed=True)
                                       + good[12:])
    for name in ("cut.bin", "dim.bin"):
        mix = tmp_path / f"{name}.yaml"
        mix.write_text(f"""
name: bad-model
data_root: {corpora()}
licenses: {{allow: [odc-by]}}
sources:
  - {{name: c4, path: c4-en-sample, max_documents: 50}}
classifier: {{model: {name}, label: hq, threshold: 0.5}}
""")
        run = _cli("run", str(mix), "-q", "-o", str(tmp_path / f"out-{name}"))
        assert run.returncode == 2, (name, run.stdout[-500:], run.stderr[-2000:])
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and "Traceback" not in run.stderr, lines


@contextmanager
def _served(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server of ``folder`` standing in for a model's host: (base URL, the
    paths requested so far)."""
    import functools
    import http.server
    import threading

    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):  # noqa: ANN001 (the request log the test reads)
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()


def test_the_classifier_stage_copies_a_model_url_once_into_the_work_folder(tmp_path):
    """The classifier stage of a datamix whose ``model`` is a URL reads the file once into
    OUT/work/downloads (a rerun's stage list reads nothing again); a URL that cannot be read
    is one line naming it. (``tokenmill run`` end to end: the slow test below.)"""
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.pipeline.run import stage_list

    served = tmp_path / "served"
    served.mkdir()
    (served / "m.bin").write_bytes(b"model bytes")
    with _served(served) as (base, requests):
        for name in ("m.bin", "gone.bin"):
            mix = tmp_path / f"{name}.yaml"
            mix.write_text(f"""
name: url
data_root: {corpora()}
sources: [{{name: c4, path: c4-en-sample}}]
classifier: {{model: "{base}/{name}", label: hq}}
""")
            cfg = load_datamix(mix, output_dir=str(tmp_path / "out"))
            if name == "gone.bin":
                with pytest.raises(ValueError, match="gone.bin") as e:
                    stage_list.calls(cfg, cfg.sources[0], "document")
                assert "\n" not in str(e.value)
                continue
            fetched = []
            for _ in range(2):
                [call] = [c for c in stage_list.calls(cfg, cfg.sources[0], "document")
                          if c.name == "classifier"]
                local = Path(call.kwargs["model"])
                assert local.read_bytes() == b"model bytes"
                assert (tmp_path / "out" / "work" / "downloads") in local.parents
                fetched.append(len(requests))
            assert fetched[0] > 0 and fetched[1] == fetched[0]  # nothing read again


@pytest.mark.slow
def test_a_model_given_by_url_is_read_once_through_run(tmp_path):
    """`model: http://...` is downloaded once into OUT/work/downloads (a loopback server
    stands in for the model's host); a URL that cannot be read is one line naming it."""
    train = tmp_path / "train.txt"
    train.write_text("".join(f"__label__hq {w} the history of science\n__label__cc {w} buy "
                             "cheap click now\n" for w in ("a", "b", "c", "d") * 20))
    served = tmp_path / "served"
    served.mkdir()
    train_tiny_model(train, served / "m.bin")
    with _served(served) as (base, requests):
        for name, url in (("ok", f"{base}/m.bin"), ("missing", f"{base}/gone.bin")):
            mix = tmp_path / f"{name}.yaml"
            mix.write_text(f"""
name: {name}
tokenizer: gpt2
data_root: {corpora()}
licenses: {{allow: [odc-by]}}
sources: [{{name: c4, path: c4-en-sample, max_documents: 40}}]
classifier: {{model: "{url}", label: hq}}
shards: {{tokens_per_shard: 100000, val_fraction: 0.0}}
""")
            r = _cli("run", str(mix), "-q", "--no-report", "-o", str(tmp_path / name))
            if name == "missing":
                assert r.returncode == 2 and "gone.bin" in r.stderr, r.stderr
                assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
                continue
            assert r.returncode == 0, r.stderr
            sidecar = next((tmp_path / name / "shards").rglob("*.docs.parquet"))
            scores = pq.read_table(sidecar).column("classifier_score").to_pylist()
            assert scores and all(0.0 <= s <= 1.0 for s in scores)
            assert list((tmp_path / name / "work" / "downloads").rglob("m.bin"))
            fetched = len(requests)
            again = _cli("run", str(mix), "-q", "--no-report", "-o", str(tmp_path / name))
            assert again.returncode == 0 and len(requests) == fetched  # nothing read again
