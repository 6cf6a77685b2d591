"""CLI: ``tokenmill export verify DIR [--mix MIX.json]``.

Reads an export (any format of ``tokenmill shards export``) back and checks it
(:func:`tokenmill.manifests.export_verify.verify_export`): prints ``OK DIR ...`` and exits 0,
or one ``FAIL`` line per problem on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import sys


def _verify(args: argparse.Namespace) -> int:
    from tokenmill.manifests.export_verify import verify_export

    listing, problems = verify_export(args.dir, args.mix, verify_mix=not args.no_verify)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in {args.dir}", file=sys.stderr)
        return 1
    streams = listing.get("streams", {})
    what = ", ".join(f"{s} {d['tokens']:,} tokens in {d['sequences']:,} sequences"
                     for s, d in streams.items()) or "sha256 only: no stream digests listed"
    against = f"; equal to {args.mix}" if args.mix else ""
    print(f"OK {args.dir}: {listing['format']} export of mix {listing['mix']}, "
          f"{len(listing['files'])} file(s) match their sha256, read back: {what}{against}")
    return 0


def add_export_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``tokenmill export verify``."""
    ex = sub.add_parser("export", help="check exports (tokenmill shards export)")
    esub = ex.add_subparsers(dest="export_command", required=True, metavar="COMMAND",
                             help="what to do with an export")
    v = esub.add_parser("verify", help="check every file's sha256 and read every split back "
                                       "through its format")
    v.add_argument("dir", help="export folder (holds export.json)")
    v.add_argument("--mix", default=None,
                   help="training-mix manifest the export must hold exactly (re-planned with "
                        "the export's loader settings)")
    v.add_argument("--no-verify", action="store_true",
                   help="with --mix: skip comparing the mix's shards' sha256 with it")
    v.set_defaults(func=_verify)
