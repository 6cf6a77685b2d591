"""The CPU part of ``benchmarks/gpu_check.sh``: ``benchmarks/gpu_check.py --cpu-toy`` runs the
same checks as on the GPU at toy sizes (kernels through the Triton interpreter, every
cross-entropy variant including the sparse n-gram bias, the whole model, the timing harness,
the n-gram side channels of a training mix over the data, and four ``tokenmill train``
runs: baseline, every side input, stopped halfway and resumed), and it stops at the first
failing check with one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tests.shared import REPO


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gpu_check():
    return _load()


@pytest.fixture
def _threads_back(monkeypatch):
    """The toy runs set TRITON_INTERPRET and torch's threads: restore both afterwards."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    from tests.train.test_train import sample_datamix

    return sample_datamix(tmp_path_factory.mktemp("gpucheck_data"),
                          {"c4-en-sample": 60, "wikipedia-wikitext-sample": 3})


@pytest.mark.slow  # four training runs; tests/train covers each check at the function level
@pytest.mark.usefixtures("_threads_back")
def test_cpu_toy_passes_every_check(gpu_check, toy_data, tmp_path, capsys):
    rc = gpu_check.main(["--cpu-toy", "--data", str(toy_data), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert "CPU TOY CHECK PASSED" in out and "FAIL" not in out
    checks = [r for r in gpu_check.ROWS if r[4] == "ok"]
    names = " ".join(f"{r[0]} {r[1]}" for r in checks)
    for needle in ("kernel objects", "prefix+mask bfloat16 grad", "LEM", "worst param grad",
                   "ngram float32 loss", "prefix+mask+ngram bfloat16 bias-value grad",
                   "ngram features --split val", "losses agree", "masked val targets",
                   "LEM wait", "resumed - uninterrupted"):
        assert needle in names, needle
    assert out.count("part ") == 1  # one summary table


@pytest.mark.usefixtures("_threads_back")
def test_first_failure_stops_with_one_line(gpu_check, monkeypatch, tmp_path, capsys):
    """A check that fails ends the run at once: one FAILED line, the table, exit 1, no later
    part run."""
    monkeypatch.setitem(gpu_check.TOL, ("ce_loss", torch.float32), (-1.0, 0.0))
    ran = []
    monkeypatch.setattr(gpu_check, "check_lem", lambda *a: ran.append("lem"))
    rc = gpu_check.main(["--cpu-toy", "--parts", "kernels"])
    out = capsys.readouterr().out
    assert rc == 1 and not ran
    failed = [line for line in out.splitlines() if line.startswith("GPU CHECK FAILED")]
    assert len(failed) == 1 and "plain float32 loss" in failed[0]
    assert out.rstrip().splitlines()[-1].endswith("FAIL")  # the table ends with the failure
