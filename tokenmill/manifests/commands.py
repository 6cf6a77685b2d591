"""CLI: ``tokenmill manifest ...`` and ``tokenmill shards ...`` (and ``tokenmill mix``)."""

from __future__ import annotations

import argparse
import sys

from tokenmill.manifests.export_commands import add_export_commands
from tokenmill.manifests.mix_commands import add_mix_commands


def _validate(args: argparse.Namespace) -> int:
    from tokenmill.manifests.validate import validate_manifest

    problems = validate_manifest(args.manifest, log=print)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in {args.manifest}", file=sys.stderr)
        return 1
    print(f"OK {args.manifest}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from tokenmill.manifests.validate import describe_manifest

    print(describe_manifest(args.manifest))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from tokenmill.manifests.validate import inspect_shard
    from tokenmill.tokenizers.arguments import tokenizer_arg

    tokenizer = tokenizer_arg(args.tokenizer) if args.tokenizer else None
    print(inspect_shard(args.shard, tokenizer=tokenizer, docs=args.docs))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("manifest", help="validate and read curation manifests (a datamix's result)")
    msub = m.add_subparsers(dest="manifest_command", required=True, metavar="COMMAND",
                            help="the command to run")
    v = msub.add_parser("validate", help="re-check every shard's existence, header and sha256")
    v.add_argument("manifest", help="a curation manifest (manifest.json) or its run folder")
    v.set_defaults(func=_validate)
    s = msub.add_parser("show", help="print a manifest's per-source table")
    s.add_argument("manifest", help="a curation manifest (manifest.json) or its run folder")
    s.set_defaults(func=_show)

    sh = sub.add_parser("shards", help="inspect and export token shards")
    shsub = sh.add_subparsers(dest="shards_command", required=True, metavar="COMMAND",
                            help="the command to run")
    i = shsub.add_parser("inspect", help="print a shard's header, counts and first documents, "
                                         "decoded")
    i.add_argument("shard", help="a token shard (.bin) written by tokenmill run or "
                   "shards export")
    i.add_argument("--tokenizer", default=None,
                   help="tokenizer to decode with: a built-in name, a tokenizer.json, a "
                        "tokenizer table or a datamix/manifest naming one (default: the one "
                        "the curation manifest or export.json beside the shard records, else "
                        "the one the header's "
                        "version implies: 1 = gpt2, 2 = cl100k_base or o200k_base); a warning "
                        "says when it cannot match the shard")
    i.add_argument("--docs", type=int, default=3, help="documents to decode (0: none)")
    i.set_defaults(func=_inspect)
    add_mix_commands(sub, shsub)  # `tokenmill mix` and `tokenmill shards export`
    add_export_commands(sub)  # `tokenmill export verify`
