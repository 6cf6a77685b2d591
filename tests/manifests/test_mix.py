"""`tokenmill mix`: planning a training datamix over real curation manifests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.manifests.mixdata import cached_test_curations, write_spec
from tests.shared import corpora
from tokenmill.atomic import sha256_file
from tokenmill.manifests.mix import build_mix, load_mix_manifest, plan_spec_file, plan_table
from tokenmill.manifests.schema import load_manifest
from tokenmill.manifests.shards import read_sidecar
from tokenmill.tokenizers import TokenizerMismatchError

THREE = {
    "c4": {"source": "c4-en-sample", "weight": 0.5, "max_epochs": 10},
    "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.3, "max_epochs": 10},
    "py": {"source": "python-docs-rst", "weight": 0.2, "max_epochs": 10},
}


@pytest.fixture(scope="module")
def cur() -> dict[str, Path]:
    return cached_test_curations(corpora("c4-en-sample").parent)


def _avail(manifest: Path, source: str) -> int:
    m = load_manifest(manifest)
    return next(s.tokens["train"] for s in m.sources if s.name == source)


def test_plan_meets_weights_and_is_deterministic(cur, tmp_path):
    spec = write_spec(tmp_path / "mix.yaml", [cur["web"], cur["ref"]], THREE, 3_000_000)
    a = build_mix(spec, tmp_path / "a" / "mix.json")
    b = build_mix(spec, tmp_path / "b" / "mix.json")
    assert (tmp_path / "a/mix.json").read_bytes() == (tmp_path / "b/mix.json").read_bytes()
    assert a == b and a.warnings == []
    assert a.total_tokens == 3_000_000
    for s, w in zip(a.sources, (0.5, 0.3, 0.2), strict=True):
        assert s.granted_tokens == pytest.approx(w * 3_000_000, abs=1)
        assert s.effective_weight == pytest.approx(w, abs=1e-6)
        assert s.epochs == pytest.approx(s.granted_tokens / s.available_tokens)
        assert s.shortfall_tokens == 0
    # sha256 of everything referenced, paths relative to the manifest's folder
    root = tmp_path / "a"
    for ref in a.curation_manifests:
        assert sha256_file(root / ref.path) == ref.sha256
    for s in a.sources:
        for sh in s.shards + s.val_shards:
            assert sha256_file(root / sh.path) == sh.sha256
    loaded = load_mix_manifest(tmp_path / "a/mix.json")
    assert loaded == a
    # one more build after touching the spec's seed changes the spec hash
    spec2 = write_spec(tmp_path / "mix2.yaml", [cur["web"], cur["ref"]], THREE, 3_000_000,
                       seed=8)
    assert build_mix(spec2, tmp_path / "c/mix.json").spec_sha256 != a.spec_sha256


def test_short_source_is_capped_with_a_warning(cur, tmp_path):
    sources = {k: dict(v) for k, v in THREE.items()}
    sources["wiki"]["max_epochs"] = 2
    target = 6_000_000  # wiki needs 1.8M but has ~0.54M x 2
    spec = write_spec(tmp_path / "mix.yaml", [cur["web"], cur["ref"]], sources, target)
    m = plan_spec_file(spec).manifest
    avail = _avail(cur["ref"], "wikipedia-wikitext-sample")
    wiki = next(s for s in m.sources if s.name == "wiki")
    assert wiki.granted_tokens == 2 * avail
    assert wiki.epochs == pytest.approx(2.0)
    assert wiki.shortfall_tokens == round(0.3 * target) - 2 * avail
    assert m.total_tokens == target - wiki.shortfall_tokens  # shrink
    msg = next(w for w in m.warnings if "'wiki'" in w)
    assert f"shortfall {wiki.shortfall_tokens:,} tokens" in msg
    assert "max_epochs 2" in msg
    table = plan_spec_file(spec).table()
    assert "WARNING" in table and "shortfall" in table
    # the table explains each share that differs from the spec's
    notes = table.split("why shares differ from the spec:")[1].splitlines()
    wnote = next(n for n in notes if n.startswith("  wiki: "))
    assert (f"capped at max_epochs 2 x {avail:,} train tokens = {2 * avail:,} tokens" in wnote
            and f"needs {round(0.3 * target):,}" in wnote and "on_shortfall: shrink" in wnote)
    c4note = next(n for n in notes if n.startswith("  c4: "))
    assert f"total shrank to {m.total_tokens:,} because wiki ran short" in c4note
    # redistribute: the others absorb the shortfall in proportion, within their caps
    spec_r = write_spec(tmp_path / "mix_r.yaml", [cur["web"], cur["ref"]], sources, target,
                        on_shortfall="redistribute")
    r = plan_spec_file(spec_r).manifest
    assert r.total_tokens == pytest.approx(target, abs=3)
    c4, py = (next(s for s in r.sources if s.name == n) for n in ("c4", "py"))
    assert c4.granted_tokens / py.granted_tokens == pytest.approx(0.5 / 0.2, rel=1e-6)
    assert next(s for s in r.sources if s.name == "wiki").granted_tokens == 2 * avail
    table = plan_table(r)
    factor = c4.granted_tokens / c4.requested_tokens
    assert f"c4: {100 * c4.effective_weight:.2f}% instead of 50.00%: granted x{factor:.3f}" \
        in table and "water-filling" in table and "on_shortfall: redistribute" in table


def test_tokenizer_mismatch_names_both_manifests(cur, tmp_path):
    spec = write_spec(tmp_path / "mix.yaml", [cur["web"], cur["wiki100k"]],
                      {"c4": {"source": "c4-en-sample", "weight": 0.5},
                       "wiki": {"source": "wikipedia-wikitext-sample", "weight": 0.5}}, 10_000)
    with pytest.raises(TokenizerMismatchError) as e:
        plan_spec_file(spec)
    assert str(cur["web"]) in str(e.value) and str(cur["wiki100k"]) in str(e.value)
    assert "gpt2@" in str(e.value) and "cl100k_base@" in str(e.value)


def test_unknown_and_ambiguous_sources(cur, tmp_path):
    spec = write_spec(tmp_path / "u.yaml", [cur["web"]], {"x": {"weight": 1.0}}, 1000)
    with pytest.raises(ValueError, match="no curation source named 'x'.*web:c4-en-sample"):
        plan_spec_file(spec)
    spec = write_spec(tmp_path / "a.yaml", [cur["web"], cur["web"]],
                      {"c4": {"source": "c4-en-sample", "weight": 1.0}}, 1000)
    with pytest.raises(ValueError, match="several manifests"):
        plan_spec_file(spec)


def test_fractional_epochs_use_document_aligned_prefixes(cur, tmp_path):
    srcs = {"py": {"source": "python-docs-rst", "weight": 1.0}}
    spec = write_spec(tmp_path / "mix.yaml", [cur["ref"]], srcs, 300_000)
    m = build_mix(spec, tmp_path / "mix.json")
    (py,) = m.sources
    assert py.granted_tokens == 300_000 and py.epochs < 1
    frac = py.granted_tokens / py.available_tokens
    assert sum(sh.range_tokens for sh in py.shards) >= py.granted_tokens
    for sh in py.shards:
        side = read_sidecar(tmp_path / sh.path)
        ends = side.column("offset").to_numpy().astype(np.int64) + side.column(
            "n_tokens").to_numpy()
        assert sh.start == 0 and sh.end in set(ends.tolist())  # ends on a document end
        assert sh.end >= frac * sh.tokens  # the same fraction of every shard
        assert sh.range_documents == int((ends <= sh.end).sum())
        assert sh.range_tokens == sh.end - sh.start
        assert sh.end < sh.tokens or sh.documents == 1


def test_schedule_by_steps(cur, tmp_path):
    spec = write_spec(
        tmp_path / "mix.yaml", [cur["web"], cur["ref"]], THREE, 1_000_000,
        schedule={"unit": "steps", "tokens_per_step": 1000,
                  "points": [{"at": 600, "weights": {"c4": 0.0, "wiki": 0.5}}]})
    m = plan_spec_file(spec).manifest
    assert [s.start_token for s in m.segments] == [0, 600_000]
    assert [s.tokens for s in m.segments] == [600_000, 400_000]
    first, second = (s.weights for s in m.segments)
    assert first == pytest.approx({"c4": 0.5, "wiki": 0.3, "py": 0.2}, rel=1e-5)
    assert second == pytest.approx({"c4": 0.0, "wiki": 0.5 / 0.7, "py": 0.2 / 0.7}, rel=1e-5)
    c4 = m.sources[0]
    assert c4.requested_share == pytest.approx(0.3)  # 0.5 for 600k tokens, 0 for 400k
    assert ("c4: requested 30.00% of the run, not the spec's 50.00%: the schedule changes "
            "the weights at steps 600 (2 segments)") in plan_table(m)
    c4 = next(s for s in m.sources if s.name == "c4")
    assert c4.granted_tokens == 300_000
    bad = write_spec(tmp_path / "bad.yaml", [cur["web"]], {"c4": {"source": "c4-en-sample",
                                                                  "weight": 1}}, 1000,
                     schedule={"unit": "steps", "points": [{"at": 5, "weights": {}}]})
    with pytest.raises(ValueError, match="tokens_per_step"):
        plan_spec_file(bad)


def test_cli_plan_and_build(cur, tmp_path, capsys):
    from tokenmill.cli import main

    spec = write_spec(tmp_path / "mix.yaml", [cur["web"], cur["ref"]], THREE, 2_000_000)
    assert main(["mix", "plan", str(spec)]) == 0
    out = capsys.readouterr().out
    head, units = out.splitlines()[:2]
    assert head.split() == ["source", "spec", "available", "max", "requested", "requested",
                            "needed", "granted", "granted", "effective", "shortfall"]
    assert units.split() == ["weight", "tokens", "epochs", "tokens", "share", "epochs",
                             "tokens", "epochs", "share", "tokens"]
    assert "c4" in out and "2,000,000" in out and "50.00%" in out
    assert "why shares differ" not in out  # nothing capped, no schedule
    assert not (tmp_path / "mix.json").exists()
    assert main(["mix", "build", str(spec), "-o", str(tmp_path / "mix.json")]) == 0
    data = json.loads((tmp_path / "mix.json").read_text())
    assert data["kind"] == "training-mix" and data["total_tokens"] == 2_000_000
