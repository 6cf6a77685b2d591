"""The ``tokenmill`` entry point: ``--version``, and errors a user can fix print at most three
lines, never a pydantic dump, a documentation link or an internal class name."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

import tokenmill
from tokenmill.cli import MAX_ERROR_LINES, build_parser, format_error, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["--version"])
    assert ex.value.code == 0
    assert capsys.readouterr().out.strip() == f"tokenmill {tokenmill.__version__}"


def test_version_from_the_installed_script() -> None:
    exe = Path(sys.executable).with_name("tokenmill")
    if not exe.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"tokenmill {tokenmill.__version__}"


def test_every_package_registers_its_commands() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"run", "report", "manifest", "shards", "tokenizer", "legality", "ngram", "mix",
            "train"} <= set(sub.choices)


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float
    steps: int = 1


def _wrapped(data: dict, path: str = "cfg.yaml") -> ValueError:
    """A loader's error as loaders raise it: the file, then pydantic's message, from the
    ValidationError."""
    try:
        _Cfg.model_validate(data)
    except ValidationError as e:
        try:
            raise ValueError(f"{path}: invalid config: {e}") from e
        except ValueError as wrapped:
            return wrapped
    raise AssertionError("expected a validation error")


def test_validation_error_is_file_then_fields() -> None:
    lines = format_error(_wrapped({"name": "x", "weight": "heavy"}))
    assert lines[0] == "cfg.yaml: invalid config"
    assert len(lines) == 2
    assert lines[1].startswith("  weight: expected a valid number") and "'heavy'" in lines[1]


def test_validation_error_at_most_three_lines_and_no_dump() -> None:
    lines = format_error(_wrapped({"weight": "heavy", "steps": "many", "bogus": 1}))
    assert len(lines) == MAX_ERROR_LINES == 3
    assert lines[0] == "cfg.yaml: invalid config"
    assert lines[1].startswith("  name: required, missing")
    assert lines[2] == "  ... and 3 more wrong fields"
    text = "\n".join(lines)
    for noise in ("pydantic", "For further information", "https://", "validation error for",
                  "input_value", "type="):
        assert noise not in text


def test_raise_from_none_keeps_its_own_message() -> None:
    try:
        try:
            _Cfg.model_validate({})
        except ValidationError:
            raise ValueError("m.json: invalid curation manifest: name: missing") from None
    except ValueError as e:
        assert format_error(e) == ["m.json: invalid curation manifest: name: missing"]


def test_unknown_field_is_named() -> None:
    lines = format_error(_wrapped({"name": "x", "weight": 1, "bogus": 1}))
    assert lines[1:] == ["  bogus: unknown field"]


def test_bare_validation_error_names_the_model() -> None:
    with pytest.raises(ValidationError) as ex:
        _Cfg.model_validate({"name": "x"})
    assert format_error(ex.value) == ["invalid _Cfg", "  weight: required, missing"]


def test_long_messages_are_cut_to_three_lines() -> None:
    lines = format_error(ValueError("\n".join(f"line {i}" for i in range(10))))
    assert lines[:2] == ["line 0", "line 1"] and len(lines) == 3
    assert "8 more lines" in lines[2]


class IndexError_(ValueError):  # noqa: N801 - mimics an internal class name
    pass


def test_main_prints_no_internal_class_name(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args):
        raise IndexError_("idx/meta.json: missing (not an index folder)")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(func=boom)

    monkeypatch.setattr("tokenmill.cli.build_parser", Parser)
    monkeypatch.delenv("TOKENMILL_DEBUG", raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err == "tokenmill: idx/meta.json: missing (not an index folder)\n"


def test_main_bad_datamix_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntokenizer: gpt2\nsources:\n  - {name: a, path: b, weight: heavy}\n"
                   "filters: {bogus: 3}\n")
    monkeypatch.delenv("TOKENMILL_DEBUG", raising=False)
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err.rstrip("\n").splitlines()
    assert 2 <= len(err) <= 3, err
    assert err[0] == f"tokenmill: {bad}: invalid datamix file"
    assert any(ln.startswith("  sources.0.weight: ") for ln in err[1:]), err
    assert "pydantic" not in "\n".join(err) and "ValueError" not in "\n".join(err)


def test_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifest", "show", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "nowhere") in err and "Error" not in err


REPO = Path(__file__).resolve().parents[1]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    acts = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(acts[0].choices) if acts else {}


def test_every_command_the_readmes_name_exists() -> None:
    import re

    top = _subcommands(build_parser())
    for doc in (REPO / "README.md", REPO / "manifests" / "README.md"):
        for m in re.finditer(r"`tokenmill ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", doc.read_text()):
            group, sub = m.groups()
            assert group in top, f"{doc.name}: `tokenmill {group}` is not a command"
            subs = _subcommands(top[group])
            if subs and sub:
                assert sub in subs, f"{doc.name}: `tokenmill {group} {sub}` is not a command"


def test_manifests_readme_lists_every_example_file() -> None:
    folder = REPO / "manifests"
    table = (folder / "README.md").read_text()
    for f in sorted(folder.iterdir()):
        if f.name != "README.md":
            assert f"| `{f.name}` |" in table, f"manifests/README.md does not list {f.name}"


def test_example_inputs_are_what_the_readme_says(tmp_path: Path) -> None:
    from tokenmill.manifests.mix import load_spec
    from tokenmill.pipeline.config import load_datamix

    folder = REPO / "manifests"
    for name in ("quickstart.yaml", "hub-sample.yaml"):
        assert load_datamix(folder / name, data_root=str(tmp_path)).name
    assert load_spec(folder / "mix-example.yaml").sources
