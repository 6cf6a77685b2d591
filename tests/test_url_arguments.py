"""A URL where a command takes only a local path is refused in one line (it would
otherwise be read or written as a local folder named ``s3:``); credentials written in a
URL are refused without being echoed; ``gs://`` without credentials fails at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenmill.cli import URL_ARGUMENTS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def _cli(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true",
            **env}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *argv], capture_output=True,
                          text=True, timeout=120, env=full, cwd=tmp_path)


@pytest.mark.parametrize("argv, url", [
    (["train", "c.yaml", "-o", "s3://runs/train"], "s3://runs/train"),
    (["manifest", "show", "s3://runs/out"], "s3://runs/out"),
    (["export", "verify", "s3://runs/export"], "s3://runs/export"),
    (["legality", "export", "t", "--format", "modded-nanogpt", "-o", "gs://b/m.bin"],
     "gs://b/m.bin"),
    (["run", "s3://runs/mix.yaml"], "s3://runs/mix.yaml"),
])
def test_a_url_where_a_local_path_is_taken_is_one_line(tmp_path: Path, argv: list[str],
                                                       url: str) -> None:
    done = _cli(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"tokenmill: {url}: `tokenmill ") and \
        "takes a local path here, not a URL" in line, line
    assert not any(tmp_path.iterdir()), "something was written locally"


def test_the_url_arguments_are_arguments_of_their_commands() -> None:
    parser = build_parser()
    for command, dests in URL_ARGUMENTS.items():
        args = parser.parse_args([*command.split(), *_required(command)])
        assert args.command_path == command and all(hasattr(args, d) for d in dests)


def _required(command: str) -> list[str]:
    return {"run": ["m.yaml"], "shards export": ["m", "--format", "megatron", "-o", "o"],
            "mix build": ["s.yaml", "-o", "o"], "ngram build": ["m", "-o", "o"],
            "legality build": ["gpt2", "-o", "o"]}[command]


def test_train_out_dir_in_the_config_must_be_local(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("data: s3://b/mix.json\nout_dir: s3://runs/t\n")
    done = _cli(tmp_path, "train", "c.yaml")
    assert done.returncode == 2 and "out_dir: a local folder" in done.stderr, done.stderr
    assert not (tmp_path / "s3:").exists()


def test_credentials_in_a_url_are_refused_and_not_echoed(tmp_path: Path) -> None:
    done = _cli(tmp_path, "mix", "build", "s3://AKIAUSERX:topsecretPW@nosuchb/spec.yaml",
                "-o", "mix.json")
    assert done.returncode == 2, done.stderr
    assert "credentials in a URL are not taken" in done.stderr
    assert "topsecretPW" not in done.stderr + done.stdout and "AKIAUSERX" not in done.stderr


def test_gs_without_credentials_off_google_cloud_fails_at_once(tmp_path: Path) -> None:
    done = _cli(tmp_path, "mix", "build", "gs://some-bucket/spec.yaml", "-o", "mix.json",
                NO_GCE_CHECK="true", GOOGLE_APPLICATION_CREDENTIALS="",
                CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    assert done.returncode == 2, done.stderr
    assert "no credentials for Google Cloud Storage" in done.stderr
