"""`tokenmill run` from the command line: summary table, and the Hub fallback of `make run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.shared import corpora

REPO = Path(__file__).resolve().parents[2]


def test_missing_data_root_falls_back_to_hub_datamix(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty-cache"),
               TOKENMILL_DATA_ROOT=str(tmp_path / "no-such-folder"))
    r = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "run", "manifests/quickstart.yaml", "-q",
         "--fallback", "manifests/hub-sample.yaml", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=REPO)
    assert "is missing" in r.stderr and "manifests/hub-sample.yaml" in r.stderr
    # offline with an empty cache the Hub source cannot be had: a clear error naming it
    assert r.returncode == 2
    assert ("source 'c4-en-validation': could not fetch Hub dataset "
            "allenai/c4@1588ec454efa1a09f29cd18ddd04fe05fc8653a2") in r.stderr


def test_blocks_line_shows_reuse_per_stage():
    from types import SimpleNamespace

    from tokenmill.pipeline.commands import blocks_line

    res = SimpleNamespace(total_units=3, reused_units=1, seconds=2.0,
                          stage_blocks={"read": [3, 0], "c4": [1, 2], "tokenize": [1, 2]})
    assert blocks_line(res) == ("blocks: 3 (1 reused whole from an earlier run; reused/blocks per "
                                "stage: read 3/3, c4 1/3, tokenize 1/3)   wall time: 2.0 s")


def test_a_pattern_given_as_the_path_points_to_allow_patterns(tmp_path):
    """A source ``path`` written as a glob is not a folder: one line, exit 2, naming
    ``allow_patterns``; the header counts one source in the singular."""
    yml = tmp_path / "glob.yaml"
    yml.write_text("name: glob\ntokenizer: gpt2\nlicenses: {allow: [odc-by]}\nsources:\n"
                   "  - {name: c4, path: 'c4-en-sample/data/*.json.gz'}\n")
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(yml), "-q",
                        "--data-root", str(corpora()), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2, r.stderr
    assert ": 1 source, tokenizer" in r.stdout
    assert not (tmp_path / "o").exists()  # a run that wrote nothing leaves no folder
    (line,) = r.stderr.strip().splitlines()
    assert "c4-en-sample/data/*.json.gz does not exist" in line and "allow_patterns" in line


def test_an_unreachable_hub_and_a_pattern_that_matches_nothing_are_one_line(tmp_path):
    """Two unusable sources, one line naming both: a Hub dataset whose host refuses the
    connection (the Hub client's several-line message folded into it) and a local folder
    whose ``allow_patterns`` leave no file (the patterns named, relative to the folder)."""
    yml = tmp_path / "two.yaml"
    yml.write_text("name: two\ntokenizer: gpt2\nlicenses: {allow: [odc-by]}\nsources:\n"
                   "  - {name: fw, hub: HuggingFaceFW/fineweb@main}\n"
                   "  - {name: c4, path: c4-en-sample, allow_patterns: ['data/*.jsonl']}\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache"),
            "HF_HOME": str(tmp_path / "home"), "HF_HUB_ETAG_TIMEOUT": "5"}
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(yml), "-q",
                        "--data-root", str(corpora()), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("tokenmill: 2 of 2 sources cannot be used: source 'fw': could not "
                           "fetch Hub dataset HuggingFaceFW/fineweb@main ("), line
    assert "source 'c4': no readable data files under" in line
    assert "matching allow_patterns ['data/*.jsonl'] (patterns relative to that folder" in line


def test_counted_words_take_their_number():
    from tokenmill.cliargs import counted

    assert [counted(n, "source") for n in (0, 1, 2, 1200)] == [
        "0 sources", "1 source", "2 sources", "1,200 sources"]
