"""The ``tokenmill`` command: one entry point, one subcommand group per package.

Each package registers its own subcommands through ``add_commands(subparsers)`` in its
``commands`` module; this file only assembles them and prints errors a user can fix.
"""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from tokenmill import __version__
from tokenmill.errors import MAX_ERROR_LINES, error_lines
from tokenmill.failures import causes, failure_line
from tokenmill.manifests import commands as manifests_commands
from tokenmill.ngram import commands as ngram_commands
from tokenmill.pipeline import commands as pipeline_commands
from tokenmill.storage import redact
from tokenmill.tokenizers import commands as tokenizers_commands
from tokenmill.train import commands as train_commands

#: The first lines of ``tokenmill --help`` (plain text: the terminal shows it as written).
DESCRIPTION = ("tokenmill: curate licensed corpora into token shards and a manifest, build "
               "tokenizer legality tables and n-gram side models over them, mix curated "
               "sources into training mixes and train a reference GPT on them. "
               "Run 'tokenmill COMMAND --help' for a command's options.")

# Packages that contribute subcommands, in the order they appear in --help.
_COMMAND_MODULES = (pipeline_commands, manifests_commands, tokenizers_commands,
                    ngram_commands, train_commands)


def build_parser() -> argparse.ArgumentParser:
    """The full ``tokenmill`` parser (``--version`` plus every package's subcommands)."""
    parser = argparse.ArgumentParser(prog="tokenmill", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tokenmill {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="the command to run")
    for module in _COMMAND_MODULES:
        module.add_commands(sub)
    _name_commands(parser, "")
    return parser


def _name_commands(parser: argparse.ArgumentParser, path: str) -> None:
    """Give every leaf command its path (``"shards export"``) as ``args.command_path``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        parser.set_defaults(command_path=path)
    for action in subs:
        for name, child in action.choices.items():
            _name_commands(child, f"{path} {name}".strip())


#: The arguments that name a file or folder; of those, the ones that may be a URL
#: (``s3://``, ``gs://``, ``hf://``) besides a local path, by command.
PATH_ARGUMENTS = frozenset({"datamix", "data_root", "output", "fallback", "output_dir",
                            "positive", "negative", "manifest", "shard", "tokenizer", "spec",
                            "dir", "mix", "encoding", "table", "index", "out", "config"})
URL_ARGUMENTS = {"run": {"data_root", "output"}, "shards export": {"manifest", "output"},
                 "mix build": {"spec", "output"}, "ngram build": {"manifest", "out"},
                 "legality build": {"output"}}


def url_refusal(args: argparse.Namespace) -> str | None:
    """One line when a path argument of this command is a URL the command cannot use
    (it would otherwise be read or written as a local folder named ``s3:``)."""
    command = getattr(args, "command_path", "")
    for dest in sorted(PATH_ARGUMENTS - URL_ARGUMENTS.get(command, set())):
        value = getattr(args, dest, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and "://" in v and not v.startswith("file://"):
                return (f"{redact(v)}: `tokenmill {command}` takes a local path here, not a "
                        "URL (see docs/cluster.md for the commands that read and write URLs)")
    return None


def _validation_error(e: BaseException) -> ValidationError | None:
    """The pydantic ``ValidationError`` ``e`` is or was raised from, if any."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, ValidationError):
            return e
        if e.__cause__ is None and e.__suppress_context__:
            return None  # `raise ... from None`: the message already says what it means
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def format_error(e: BaseException) -> list[str]:
    """The lines ``tokenmill`` prints for an error a user can fix: at most
    :data:`MAX_ERROR_LINES`, never an internal class name.

    A config or manifest that fails pydantic validation gives its file (the wrapping error's
    message up to the validation dump) and then one line per wrong field by its path."""
    msg = str(e).strip()
    verr = _validation_error(e)
    if verr is not None:
        dump = str(verr).strip()
        head = msg.split(dump)[0].rstrip(": \n") if dump and dump in msg and msg != dump else ""
        if not head:
            head = f"invalid {verr.title}" if msg == dump else msg.splitlines()[0]
        return error_lines(head, verr, max_lines=MAX_ERROR_LINES)
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return [f"{e.filename}: {e.strerror}"]
    lines = [ln for ln in msg.splitlines() if ln.strip()] or [type(e).__name__]
    if len(lines) > MAX_ERROR_LINES:
        more = len(lines) - MAX_ERROR_LINES + 1
        lines = lines[: MAX_ERROR_LINES - 1] + [f"  ... ({more} more lines; "
                                                "TOKENMILL_DEBUG=1 shows everything)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run one command. Errors a user can fix (bad config, missing files, wrong tokenizer)
    print at most three lines and exit 2; ``TOKENMILL_DEBUG=1`` shows the traceback instead."""
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)  # Ray's banners are not our output
    # the Hub client's retry warnings (one per try) would bury the one line a failed Hub read
    # ends in; that line names the repository and the cause
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = url_refusal(args)
    if refused is not None:
        print(f"tokenmill: {refused}", file=sys.stderr)
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        if os.environ.get("TOKENMILL_DEBUG") == "1":
            raise
        print("tokenmill: interrupted (Ctrl-C); a rerun resumes from the finished work",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tokenmill manifest show OUT | head`
        sys.stderr.close()
        return 0
    except Exception as e:
        if os.environ.get("TOKENMILL_DEBUG") == "1":
            raise
        line = failure_line(e)
        user = _user_error(e) if line is None else None
        if line is None and user is None:
            raise
        lines = [line] if line is not None else format_error(user)
        print("tokenmill: " + "\n".join(lines), file=sys.stderr)
        return 2
    return int(rc or 0)


#: Errors a user can fix: printed as at most three lines, exit status 2.
USER_ERRORS = (ValueError, RuntimeError, FileNotFoundError, FileExistsError,
               NotADirectoryError, IsADirectoryError, PermissionError)


def _user_error(e: BaseException) -> BaseException | None:
    """The user error ``e`` is or a Ray task raised (a Ray task error is printed as its
    cause, never as the worker's traceback), else ``None``."""
    for x in causes(e):
        if any("RayTaskError" in t.__name__ for t in type(x).__mro__):
            continue  # its cause follows
        if isinstance(x, USER_ERRORS):
            return x
        return None
    return None


if __name__ == "__main__":
    sys.exit(main())
