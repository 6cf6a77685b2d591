"""CLI: ``tokenmill ngram {build,count,longest}``."""

from __future__ import annotations

import argparse


def _orders(text: str) -> list[int]:
    """``"2-8"`` or ``"2,3,5"`` -> orders; a ValueError naming the option otherwise."""
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            out = list(range(int(a), int(b) + 1))
        else:
            out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out:
        raise ValueError(f"--orders {text!r}: expected a range like 2-8 or a list like 2,3,5")
    return out


def _build(args: argparse.Namespace) -> int:
    from tokenmill.ngram.index import build_index

    orders = _orders(args.orders) if args.counts else None  # checked before any work
    s = build_index(args.manifest, args.out, split=None if args.split == "all" else args.split,
                    progress=not args.quiet)
    rows = [("tokens", f"{s['tokens']:,}"), ("parts / shards", f"{s['parts']} / {s['shards']}"),
            ("build time", f"{s['seconds']:.2f} s"),
            ("build speed", f"{s['tokens'] / s['seconds'] / 1e6:.2f} M tokens/s"),
            ("index size", f"{s['bytes'] / 2**20:.1f} MiB"),
            ("bytes/token", f"{s['bytes_per_token']:.3f}")]
    if args.counts:
        from tokenmill.ngram.counts import build_counts

        c = build_counts(args.manifest, f"{args.out}/counts", orders=orders,
                         split=None if args.split == "all" else args.split,
                         ray_address=args.ray_address, progress=not args.quiet)
        rows.append(("counts build time", f"{c['seconds']:.2f} s"))
        rows += [(f"order {n} contexts", f"{v:,}") for n, v in c["contexts"].items()]
    w = max(len(r[0]) for r in rows)
    print(f"suffix-array index -> {args.out}")
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    return 0


def _encode(index, text: str) -> list[int]:
    from tokenmill.tokenizers import get_encoding

    return get_encoding(index.tokenizer.name).encode_ordinary(text)


def _count(args: argparse.Namespace) -> int:
    from tokenmill.ngram.index import SuffixArrayIndex

    index = SuffixArrayIndex(args.index)
    toks = _encode(index, args.text)
    print(f"tokens  {toks}")
    print(f"count   {index.count(toks)}")
    return 0


def _longest(args: argparse.Namespace) -> int:
    from tokenmill.ngram.index import SuffixArrayIndex
    from tokenmill.tokenizers import get_encoding

    index = SuffixArrayIndex(args.index)
    enc = get_encoding(index.tokenizer.name)
    toks = _encode(index, args.text)
    m = index.longest_match(toks, k=args.k)
    matched = toks[len(toks) - m.length:] if m.length else []
    print(f"match length  {m.length} of {len(toks)} tokens ({m.count} occurrences)")
    print(f"matched text  {enc.decode(matched)!r}")
    total = max(m.count, 1)  # every occurrence has a follower (EOT at document ends)
    print("next tokens:")
    for t, c in zip(m.next_tokens.tolist(), m.next_counts.tolist(), strict=True):
        if t < 0:
            break
        print(f"  {c:>8d}  {c / total:6.1%}  {t:>6d}  {enc.decode([t])!r}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ngram", help="n-gram side models: suffix-array index, counts")
    nsub = p.add_subparsers(dest="ngram_command", required=True)
    b = nsub.add_parser("build", help="build the suffix-array index of a manifest's shards")
    b.add_argument("manifest", help="manifest.json or its folder")
    b.add_argument("-o", "--out", required=True, help="index folder")
    b.add_argument("--split", default="train", choices=["train", "val", "all"])
    b.add_argument("--counts", action="store_true",
                   help="also build the n-gram counts model (Ray) into OUT/counts")
    b.add_argument("--orders", default="2-8", help="counts orders, e.g. 2-8 or 2,3,5")
    b.add_argument("--ray-address", default=None)
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=_build)
    c = nsub.add_parser("count", help="count a text's tokens as one n-gram")
    c.add_argument("index")
    c.add_argument("text")
    c.set_defaults(func=_count)
    lg = nsub.add_parser("longest", help="longest suffix of a text found in the index")
    lg.add_argument("index")
    lg.add_argument("text")
    lg.add_argument("-k", type=int, default=5, help="next tokens to show")
    lg.set_defaults(func=_longest)
