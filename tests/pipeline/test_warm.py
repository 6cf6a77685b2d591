"""The kernel warm-up that `make setup` and the test run call: compiled once per change of
the package's sources, skipped when its stamp names the same sources."""

from __future__ import annotations

from tokenmill.pipeline import warm


def test_warm_up_runs_once_per_change_of_the_sources(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(warm, "_compile_kernels", lambda: calls.append(1))
    monkeypatch.setattr(warm, "_stamp", lambda: tmp_path / "cache" / "warm.stamp")
    warm.warm_numba_cache()
    warm.warm_numba_cache()
    assert len(calls) == 1
    stamp = tmp_path / "cache" / "warm.stamp"
    assert stamp.read_text().splitlines()[0] == warm._fingerprint()
    monkeypatch.setattr(warm, "_fingerprint", lambda: "a changed source")
    warm.warm_numba_cache()
    assert len(calls) == 2
    # a cache file the stamp lists is gone (a __pycache__ folder deleted): compiled again
    stamp.write_text("a changed source\npipeline/__pycache__/gone.nbi\n")
    warm.warm_numba_cache()
    assert len(calls) == 3


def test_the_fingerprint_covers_every_source_file_of_the_package():
    sources = sorted(warm.PACKAGE.rglob("*.py"))
    assert warm.PACKAGE.name == "tokenmill" and len(sources) > 50
    assert len(warm._fingerprint()) == 64
