"""The stage list is declared once, and a stage's config is part of its blocks' cache key."""

from __future__ import annotations

from tests.shared import corpora
from tokenmill.manifests.schema import SourceCounts
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.report.curation_report import report_stage_order
from tokenmill.pipeline.run import stage_list as stages
from tokenmill.pipeline.run.executor import run_datamix
from tokenmill.raysession import ray_session


def _cfg(out, min_num_sentences: int) -> DatamixConfig:
    return DatamixConfig(
        name="stages", data_root=str(corpora()), output_dir=str(out), block_documents=400,
        sources=[{"name": "c4", "path": "c4-en-sample"}],
        quality={"gopher_repetition": {}, "c4": {"modify_text": False,
                                                  "min_num_sentences": min_num_sentences},
                 "fineweb": {}})


def test_changing_one_filter_recomputes_exactly_that_stage_on(tmp_path):
    out = tmp_path / "out"
    with ray_session(num_cpus=1):
        first = run_datamix(_cfg(out, 5), progress=False)
        again = run_datamix(_cfg(out, 5), progress=False)
        changed = run_datamix(_cfg(out, 3), progress=False)
    n = first.total_units
    assert n == 3  # 1000 rows in blocks of 400
    assert all(v == [0, n] for v in first.stage_blocks.values()), first.stage_blocks
    assert again.reused_units == n
    before_c4 = ["read", "normalize", "length", "gopher_repetition"]
    from_c4 = ["c4", "fineweb", "prepare", "tokenize"]
    assert list(changed.stage_blocks) == before_c4 + from_c4
    for name in before_c4:
        assert changed.stage_blocks[name] == [n, 0], (name, changed.stage_blocks)
    for name in from_c4:
        assert changed.stage_blocks[name] == [0, n], (name, changed.stage_blocks)
    # and the change took effect: fewer documents fail the (looser) sentence count
    c4_first = first.manifest.sources[0].stages["c4"]["rejected"]
    c4_changed = changed.manifest.sources[0].stages["c4"]["rejected"]
    assert c4_changed["c4:too_few_sentences"] < c4_first["c4:too_few_sentences"]


def test_everything_is_derived_from_the_one_stage_list(tmp_path):
    names = [s.name for s in stages.STAGES]
    assert len(set(names)) == len(names)
    # the report's order is the stage list's (read errors right after read)
    STAGE_ORDER = report_stage_order()
    assert STAGE_ORDER[:2] == ("read", "read_errors")
    assert [n for n in STAGE_ORDER if n not in ("read_errors", "quarantine")] == [
        s.name for s in stages.STAGES if s.in_manifest]
    # every count field of the manifest is fed by some stage, and only those
    fed = {s.counts for s in stages.STAGES if s.counts}
    assert fed == set(SourceCounts.model_fields) - {"read", "kept"}
    # every stage has the DocumentStage / GlobalStage shape: a name, version, fingerprint
    model = tmp_path / "model.bin"
    model.write_bytes(b"not read: the stage loads its model on its first block")
    evals = tmp_path / "evals.jsonl"
    evals.write_text('{"answer": "an answer long enough to hold one n-gram of the twelve '
                     'words decontamination matches"}\n')
    cfg = DatamixConfig(name="x", sources=[{"name": "s", "path": "s", "url_field": "url",
                                         "document_license": "cc-attributes"}],
                        quality={n: {} for n in ("gopher_quality", "gopher_repetition", "c4",
                                                 "fineweb")},
                        language={}, fuzzy_dedup={}, url_filter={}, pii={},
                        substring_dedup={}, span_dedup={},
                        classifier={"model": str(model), "label": "hq", "top_fraction": 0.5},
                        output_dir=str(tmp_path),
                        decontamination={"eval_sets": [{"name": "e", "path": str(evals)}]})
    for s in stages.STAGES:
        kw = s.kwargs(cfg, cfg.sources[0])
        if s.scope == "read":
            continue
        step = s.instance(kw)
        assert step.name == s.name and isinstance(step.version, int)
        assert len(step.fingerprint()) == 64
