"""The options (and counted words) every ``tokenmill`` command spells the same way.

``-o/--output`` names what a command writes and ``-q/--quiet`` turns off its progress
output. Older spellings (``--out``, ``--no-progress``) still parse, as hidden aliases that
``--help`` does not show, so existing scripts keep working.
"""

from __future__ import annotations

import argparse


def add_output_argument(parser: argparse.ArgumentParser, *, help: str, dest: str = "output",
                        required: bool = False, default: str | None = None,
                        metavar: str = "DIR", aliases: tuple[str, ...] = ()) -> None:
    """Add ``-o/--output`` (value stored in ``dest``), plus hidden ``aliases`` such as
    ``"--out"``. With ``required``, exactly one of the spellings must be given (argparse
    exits 2 naming ``-o/--output`` otherwise)."""
    target = parser.add_mutually_exclusive_group(required=True) if required else parser
    target.add_argument("-o", "--output", dest=dest, default=default, metavar=metavar,
                        help=help)
    for alias in aliases:
        target.add_argument(alias, dest=dest, default=default, metavar=metavar,
                            help=argparse.SUPPRESS)


def add_quiet_argument(parser: argparse.ArgumentParser, *, help: str = "no progress output",
                       dest: str = "quiet", aliases: tuple[str, ...] = ()) -> None:
    """Add ``-q/--quiet`` (``store_true`` into ``dest``), plus hidden ``aliases`` such as
    ``"--no-progress"``."""
    parser.add_argument("-q", "--quiet", dest=dest, action="store_true", help=help)
    for alias in aliases:
        parser.add_argument(alias, dest=dest, action="store_true", help=argparse.SUPPRESS)


def counted(n: int, noun: str) -> str:
    """``"1 source"``, ``"3 sources"``: ``n`` with ``noun`` (a regular plural in -s) in the
    number it takes."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
