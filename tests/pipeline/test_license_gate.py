"""A datamix naming an unknown or disallowed license fails before any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.shared import corpora
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.read.license import LicenseError, cc_attribute_license
from tokenmill.pipeline.read.sources import SourceError
from tokenmill.pipeline.run.executor import run_datamix


def _cfg(tmp_path, sources, allow=None):
    d = {"name": "lic", "data_root": str(corpora()), "output_dir": str(tmp_path / "out"),
         "sources": sources}
    if allow is not None:
        d["licenses"] = {"allow": allow}
    return DatamixConfig.model_validate(d)


def test_disallowed_license_refused_before_work(tmp_path):
    cfg = _cfg(tmp_path, [{"name": "c4", "path": "c4-en-sample"},
                          {"name": "linux", "path": "linux-docs-rst"}], allow=["odc-by"])
    with pytest.raises(LicenseError, match=r"source 'linux' has license 'gpl-2.0'"):
        run_datamix(cfg, num_cpus=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_unknown_license_override_refused(tmp_path):
    cfg = _cfg(tmp_path, [{"name": "c4", "path": "c4-en-sample", "license": "made-up-1.0"}])
    with pytest.raises(LicenseError, match=r"'c4' has license 'made-up-1.0'"):
        run_datamix(cfg, num_cpus=1, progress=False)


def test_sources_without_license_refused_in_one_error(tmp_path):
    """Every source without a license (and every disallowed one) in one error: a user
    fixes them all at once, not one per run."""
    for name in ("nolic", "nolic2"):
        (tmp_path / name / "data").mkdir(parents=True)
        (tmp_path / name / "data" / "a.txt").write_text("hello")
    cfg = _cfg(tmp_path, [{"name": "nolic", "path": str(tmp_path / "nolic")},
                          {"name": "c4", "path": "c4-en-sample"},
                          {"name": "nolic2", "path": str(tmp_path / "nolic2")},
                          {"name": "linux", "path": "linux-docs-rst"}], allow=["odc-by"])
    with pytest.raises(SourceError) as e:
        run_datamix(cfg, num_cpus=1, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, LicenseError)
    assert msg.startswith("no license for 2 sources: 'nolic' (no license in "
                          f"{tmp_path / 'nolic' / 'README.md'}), 'nolic2' (no license in ")
    assert "source 'linux' has license 'gpl-2.0'" in msg
    assert not (tmp_path / "out").exists()


def test_cli_names_source_and_license(tmp_path):
    yml = tmp_path / "mix.yaml"
    yml.write_text(f"name: x\ndata_root: {corpora()}\nlicenses: {{allow: [mit]}}\n"
                   "sources: [{name: wiki, path: wikipedia-wikitext-sample}]\n")
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(yml), "-q",
                        "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2
    assert "source 'wiki' has license 'cc-by-sa-3.0'" in r.stderr


def test_cc_attribute_names():
    assert cc_attribute_license("cc_re__cc_re__cc_by_nc_sa_4_0") == "cc-by-nc-sa-4.0"
    assert cc_attribute_license("cc_re__cc_re__cc_by_sa_3_0_it") == "cc-by-sa-3.0-it"
    assert cc_attribute_license("cc_re__cc_re__cc_publicdomain_zero_1_0") == \
        "cc-publicdomain-zero-1.0"
