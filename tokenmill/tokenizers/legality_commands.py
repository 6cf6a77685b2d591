"""CLI: ``tokenmill legality {build,query,prefix,stats}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _load_or_build(encoding: str, table: str | None, progress: bool = True):
    from tokenmill.tokenizers.legality import LegalityTable

    if table:
        return LegalityTable.load(table, encoding=encoding)
    print(f"building the {encoding} table in memory (pass --table DIR to reuse a saved one)",
          file=sys.stderr)
    return LegalityTable.build(encoding, progress=progress)


def _build(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers.legality import SPEEDRUN_GPT2_IMPOSSIBLE, LegalityTable

    table = LegalityTable.build(args.encoding, progress=not args.quiet)
    out = table.save(Path(args.output))
    n = table.meta["n_impossible"]
    V = table.n_vocab
    print(f"{'encoding':22s} {args.encoding}")
    print(f"{'tokenizer':22s} {table.identity.short()}")
    print(f"{'regex model':22s} {table.meta['model']}")
    print(f"{'build time':22s} {table.meta['build_seconds']:.2f} s "
          f"({table.meta['threads']} threads)")
    print(f"{'impossible pairs':22s} {n:,} of {V * V:,} ({100 * n / (V * V):.2f}%)")
    if args.encoding in ("gpt2", "r50k_base"):
        print(f"{'speedrun record mask':22s} {SPEEDRUN_GPT2_IMPOSSIBLE:,} "
              f"(ours / record = {n / SPEEDRUN_GPT2_IMPOSSIBLE:.3f})")
    print(f"{'written':22s} {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


def _query(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers import get_encoding
    from tokenmill.tokenizers.legality import (
        LegalityTable,
        analyze,
        explain_pair,
        pair_possible,
        resolve_token,
    )

    enc = get_encoding(args.encoding)
    a, b = resolve_token(enc, args.prev), resolve_token(enc, args.next)
    if args.table:
        table = LegalityTable.load(args.table, encoding=args.encoding)
        print(table.explain(a, b))
    else:  # one pair: the same definition, computed directly
        an = analyze(enc)
        print(explain_pair(an, a, b, pair_possible(an, a, b)))
    return 0


def _prefix(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers import get_encoding
    from tokenmill.tokenizers.legality import resolve_token
    from tokenmill.tokenizers.prefix import PrefixMap

    enc = get_encoding(args.encoding)
    t = resolve_token(enc, args.token)
    pm = PrefixMap.build(enc)
    chain = pm.chain(t)
    shown = []
    for x in chain:
        try:
            shown.append(f"{enc.decode_single_token_bytes(x).decode('utf-8', 'backslashreplace')!r}"
                         f"({x})")
        except KeyError:
            shown.append(f"<special>({x})")
    print(" -> ".join(shown) + " -> -1")
    return 0


def _stats(args: argparse.Namespace) -> int:
    import numpy as np

    table = _load_or_build(args.encoding, args.table)
    per_row = table.impossible_per_row()
    V = table.n_vocab
    total = int(per_row.sum())
    print(f"{'encoding':22s} {args.encoding} ({table.identity.short()})")
    print(f"{'impossible pairs':22s} {total:,} of {V * V:,} ({100 * total / (V * V):.2f}%)")
    print(f"{'per previous token':22s} min {int(per_row.min()):,}  "
          f"median {int(np.median(per_row)):,}  max {int(per_row.max()):,}")
    if "build_seconds" in table.meta:
        print(f"{'build time':22s} {table.meta['build_seconds']:.2f} s")
    return 0


def add_legality_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``tokenmill legality ...``."""
    p = sub.add_parser("legality", help="tokenizer legality tables (impossible pairs, prefixes)")
    lsub = p.add_subparsers(dest="legality_command", required=True)
    b = lsub.add_parser("build", help="build and save the impossible-continuation table")
    b.add_argument("encoding")
    b.add_argument("-o", "--output", required=True, help="output folder (or file)")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=_build)
    q = lsub.add_parser("query", help="is NEXT possible after PREV, and why")
    q.add_argument("encoding")
    q.add_argument("prev", help="token id, quoted literal (' bananas') or text of one token")
    q.add_argument("next")
    q.add_argument("--table", help="a saved table (file or folder); default: compute directly")
    q.set_defaults(func=_query)
    x = lsub.add_parser("prefix", help="longest-token-prefix chain of a token")
    x.add_argument("encoding")
    x.add_argument("token")
    x.set_defaults(func=_prefix)
    s = lsub.add_parser("stats", help="impossible pairs in total and per previous token")
    s.add_argument("encoding")
    s.add_argument("--table", help="a saved table (file or folder); default: build in memory")
    s.set_defaults(func=_stats)
