"""CLI: ``tokenmill legality {build,query,prefix,stats,export}``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tokenmill import storage
from tokenmill.cliargs import add_output_argument, add_quiet_argument


def _load_or_build(encoding: str, table: str | None, progress: bool = True):
    """``(table, seconds, how)``: a saved table loaded (``how`` = "load") or, without
    ``table``, one built in memory (``how`` = "build")."""
    from tokenmill.tokenizers.legality import LegalityTable

    t0 = time.perf_counter()
    if table:
        loaded = LegalityTable.load(table, encoding=encoding)
        return loaded, time.perf_counter() - t0, "load"
    print(f"building the {encoding} table in memory (pass --table DIR to reuse a saved one)",
          file=sys.stderr)
    built = LegalityTable.build(encoding, progress=progress)
    return built, time.perf_counter() - t0, "build"


def _build(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers.legality import SPEEDRUN_GPT2_IMPOSSIBLE, LegalityTable
    from tokenmill.tokenizers.prefix import PrefixMap

    if storage.is_url(args.output):
        storage.check_bucket(args.output)  # before the build, not after it
    table = LegalityTable.build(args.encoding, progress=not args.quiet)
    folder, name = _table_place(args.output, table.identity.name)
    # a URL: saved in a local folder, then uploaded with the table last (its record)
    with storage.output_folder(folder, name) as local:
        out = table.save(local / name)
        prefix_out = PrefixMap.build(args.encoding).save(out.parent)  # beside the table
        sizes = out.stat().st_size, prefix_out.stat().st_size
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
    print(f"{'written':22s} {storage.redact(storage.join(folder, name))} "
          f"({sizes[0] / 2**20:.1f} MiB)")
    print(f"{'prefix map':22s} {storage.redact(storage.join(folder, prefix_out.name))} "
          f"({sizes[1] / 2**10:.0f} KiB)")
    return 0


def _table_place(output: str, name: str) -> tuple[str, str]:
    """``(folder, file name)`` of the table ``legality build -o OUTPUT`` writes: OUTPUT
    itself when it names a file (has a suffix), else ``NAME.legality`` in the folder
    OUTPUT (a path or a URL)."""
    if storage.is_url(output):
        url = storage.normalize(output)
        head, _, last = url.partition("://")[2].rpartition("/")
        if head and "." in last:  # a file below the bucket
            return url[: -len(last) - 1], last
        return url, f"{name}.legality"
    p = Path(output)
    if p.is_dir() or p.suffix == "":
        return str(p), f"{name}.legality"
    return str(p.parent), p.name


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

    table, seconds, how = _load_or_build(args.encoding, args.table)
    per_row = table.impossible_per_row()
    V = table.n_vocab
    total = int(per_row.sum())
    print(f"{'encoding':22s} {args.encoding} ({table.identity.short()})")
    print(f"{'impossible pairs':22s} {total:,} of {V * V:,} ({100 * total / (V * V):.2f}%)")
    print(f"{'per previous token':22s} min {int(per_row.min()):,}  "
          f"median {int(np.median(per_row)):,}  max {int(per_row.max()):,}")
    if how == "load":
        print(f"{'load time':22s} {seconds:.2f} s ({args.table})")
        if "build_seconds" in table.meta:
            print(f"{'build time (saved)':22s} {table.meta['build_seconds']:.2f} s, "
                  "when the table was built")
    else:
        print(f"{'build time':22s} {seconds:.2f} s (in memory, not saved)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from tokenmill.tokenizers.legality import LegalityTable, export_modded_nanogpt

    table = LegalityTable.load(args.table, encoding=args.encoding)
    out = export_modded_nanogpt(table, Path(args.output), vocab_size=args.vocab_size)
    Vp = (args.vocab_size or -(-table.n_vocab // 128) * 128)
    print(f"{'format':22s} modded-nanogpt canon_mask (a set bit = forbidden pair)")
    print(f"{'tokenizer':22s} {table.identity.short()} ({table.n_vocab:,} ids, padded to "
          f"{Vp:,})")
    print(f"{'forbidden pairs':22s} {table.n_impossible():,}")
    print(f"{'written':22s} {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    print(f"{'read it with':22s} np.fromfile(path, np.uint8, offset=4096)"
          f".reshape({Vp}, {Vp // 8})")
    return 0


def _resolving(func):
    """``func`` after loading the tokenizer ``--encoding`` / ENCODING names
    (:func:`~tokenmill.tokenizers.arguments.tokenizer_arg`), replaced by its name."""
    def run(args: argparse.Namespace) -> int:
        from tokenmill.tokenizers.arguments import tokenizer_arg

        if args.encoding is not None:
            args.encoding = tokenizer_arg(args.encoding)
        return func(args)
    return run


_ENCODING_HELP = ("tokenizer: a tiktoken encoding name (gpt2), or a file: a tokenizer table "
                  "(YAML/JSON), a tokenizer.json, or a datamix or manifest whose tokenizer "
                  "is used")


def add_legality_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``tokenmill legality ...``."""
    p = sub.add_parser("legality", help="tokenizer legality tables (impossible pairs, prefixes)")
    lsub = p.add_subparsers(dest="legality_command", required=True, metavar="COMMAND",
                            help="the command to run")
    b = lsub.add_parser("build", help="build and save the impossible-continuation table and "
                        "the prefix map beside it")
    b.add_argument("encoding", help=_ENCODING_HELP)
    add_output_argument(b, required=True, metavar="PATH", help="output folder (or file): a "
                        "path or an s3:// or gs:// URL")
    add_quiet_argument(b, help="no progress bar")
    b.set_defaults(func=_resolving(_build))
    q = lsub.add_parser("query", help="is NEXT possible after PREV, and why")
    q.add_argument("encoding", help=_ENCODING_HELP)
    q.add_argument("prev", help="token id, quoted literal (' bananas') or text of one token")
    q.add_argument("next", help="the following token, in the same forms as PREV")
    q.add_argument("--table", help="a saved table (file or folder); default: compute directly")
    q.set_defaults(func=_resolving(_query))
    x = lsub.add_parser("prefix", help="longest-token-prefix chain of a token")
    x.add_argument("encoding", help=_ENCODING_HELP)
    x.add_argument("token", help="token id, quoted literal (' bananas') or text of one token")
    x.set_defaults(func=_resolving(_prefix))
    s = lsub.add_parser("stats", help="impossible pairs in total and per previous token")
    s.add_argument("encoding", help=_ENCODING_HELP)
    s.add_argument("--table", help="a saved table (file or folder); default: build in memory")
    s.set_defaults(func=_resolving(_stats))
    e = lsub.add_parser("export", help="write a saved table in another trainer's format")
    e.add_argument("table", help="a saved table (file or folder)")
    e.add_argument("--format", required=True, choices=["modded-nanogpt"],
                   help="modded-nanogpt: its canon_mask, uint8[V, V // 8], 1 = forbidden pair")
    add_output_argument(e, required=True, metavar="FILE", help="output file")
    e.add_argument("--encoding", default=None,
                   help="check the table against this tokenizer (default: the table's own): "
                   "a name or file, as ENCODING of build")
    e.add_argument("--vocab-size", type=int, default=None,
                   help="the model's padded vocabulary (default: next multiple of 128)")
    e.set_defaults(func=_resolving(_export))
