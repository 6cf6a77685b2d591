"""Every ``tokenmill`` command follows the same conventions: ``-o/--output`` for what it
writes, ``-q/--quiet`` for its progress output, plain-text ``--help`` and a help string for
every positional argument. Older spellings still parse but are not shown."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenmill.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

#: Commands that write files at a place the user chooses (``-o/--output``).
WRITES = {"run", "mix build", "shards export", "legality build", "legality export",
          "ngram build", "ngram lem", "ngram features", "train"}
#: Commands that show progress while they work (``-q/--quiet``).
SHOWS_PROGRESS = {"run", "legality build", "ngram build", "ngram features", "train"}
#: Markup that a terminal would show literally: RST roles and double backquotes.
MARKUP = re.compile(r"``|:(func|class|mod|meth|data|attr):`")


def _commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``("ngram build", parser)`` for the top-level parser ("") and every subcommand."""
    def walk(parser: argparse.ArgumentParser, path: str):
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}".strip())
    yield from walk(build_parser(), "")


def _visible_options(parser: argparse.ArgumentParser) -> list[list[str]]:
    return [a.option_strings for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS]


COMMANDS = dict(_commands())


def test_the_writing_and_progress_command_lists_name_real_commands() -> None:
    assert WRITES | SHOWS_PROGRESS <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_is_plain_text_and_every_positional_says_what_it_is(name: str) -> None:
    parser = COMMANDS[name]
    text = parser.format_help()
    assert not MARKUP.search(text), f"tokenmill {name} --help shows markup:\n{text}"
    for action in parser._actions:
        if not action.option_strings:
            assert action.help and action.help != argparse.SUPPRESS, (
                f"tokenmill {name}: positional {action.dest!r} has no help")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_output_and_quiet_have_one_visible_spelling(name: str) -> None:
    options = _visible_options(COMMANDS[name])
    flat = {s for strings in options for s in strings}
    assert not flat & {"--out", "--no-progress"}, f"tokenmill {name} shows an old spelling"
    for strings in options:
        if "-o" in strings or "--output" in strings:
            assert strings == ["-o", "--output"], (name, strings)
        if "-q" in strings or "--quiet" in strings:
            assert strings == ["-q", "--quiet"], (name, strings)
    if name in WRITES:
        assert ["-o", "--output"] in options, f"tokenmill {name} writes but has no -o/--output"
    if name in SHOWS_PROGRESS:
        assert ["-q", "--quiet"] in options, f"tokenmill {name} has no -q/--quiet"


@pytest.mark.parametrize(("argv", "want"), [
    (["ngram", "build", "m.json", "--out", "idx"], {"out": "idx"}),
    (["ngram", "lem", "mix.json", "--out", "lem"], {"out": "lem"}),
    (["ngram", "features", "mix.json", "--out", "nf"], {"out": "nf"}),
    (["train", "c.yaml", "--out", "run", "--no-progress"], {"out": "run", "no_progress": True}),
    (["train", "c.yaml", "-o", "run", "-q"], {"out": "run", "no_progress": True}),
    (["legality", "build", "gpt2", "-o", "t", "--quiet"], {"output": "t", "quiet": True}),
])
def test_hidden_aliases_parse_like_the_shown_spellings(argv: list[str],
                                                       want: dict[str, object]) -> None:
    args = build_parser().parse_args(argv)
    assert {k: getattr(args, k) for k in want} == want


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_tokenmill_help_through_the_command() -> None:
    top = _cli("--help")
    assert top.returncode == 0 and top.stdout.startswith("usage: tokenmill")
    assert not MARKUP.search(top.stdout) and "`" not in top.stdout, top.stdout
    build = _cli("ngram", "build", "--help")
    assert build.returncode == 0 and "-o DIR, --output DIR" in build.stdout
    assert "--out " not in build.stdout and "--out\n" not in build.stdout, build.stdout
    missing = _cli("ngram", "build", "m.json")
    assert missing.returncode == 2 and "-o/--output" in missing.stderr, missing.stderr
