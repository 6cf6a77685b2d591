"""The ``tokenmill`` command: one entry point, one subcommand group per package.

Each package registers its own subcommands through ``add_commands(subparsers)`` in its
``commands`` module; this file only assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Packages that contribute subcommands, in the order they appear in --help.
_COMMAND_MODULES = (
    "tokenmill.pipeline.commands",
    "tokenmill.manifests.commands",
    "tokenmill.tokenizers.commands",
    "tokenmill.ngram.commands",
    "tokenmill.train.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a real missing dependency, not a missing command module
                raise
            continue
        module.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Errors a user can fix (bad config, missing files, wrong tokenizer)
    print one line and exit 2; ``TOKENMILL_DEBUG=1`` shows the traceback instead."""
    import logging
    import os

    logging.getLogger("ray").setLevel(logging.ERROR)  # Ray's banners are not our output
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tokenmill manifest show OUT | head`
        sys.stderr.close()
        return 0
    except (ValueError, RuntimeError, FileNotFoundError, FileExistsError,
            NotADirectoryError) as e:
        if os.environ.get("TOKENMILL_DEBUG") == "1":
            raise
        msg = str(e).strip().splitlines()
        print(f"tokenmill: {type(e).__name__}: " + "\n  ".join(msg[:20]), file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
