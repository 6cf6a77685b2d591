"""CLI: ``tokenmill ngram {build,count,longest,prob,pairs}``.

Token text is shown faithfully: a token's bytes that are not complete UTF-8 (a piece of a
multi-byte character) are printed as escapes (``'\\xe6'``), never as U+FFFD.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenmill import storage
from tokenmill.cliargs import add_output_argument, add_quiet_argument
from tokenmill.ngram.ngramfeat_commands import add_features_command, parse_orders
from tokenmill.ngram.precompute_commands import add_lem_command, positive_int

# --------------------------------------------------------------------------- token text


def show_bytes(b: bytes) -> str:
    """Quoted text of raw token bytes: valid UTF-8 as characters (escaped like ``repr``),
    every byte that is not part of a complete UTF-8 character as ``\\xNN``."""
    out = []
    for ch in b.decode("utf-8", "surrogateescape"):
        if "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch == "'":
            out.append("\\'")
        else:
            out.append(repr(ch)[1:-1])
    return "'" + "".join(out) + "'"


def _token_bytes(enc, t: int) -> bytes:
    try:
        return enc.decode_single_token_bytes(t)
    except KeyError:
        return f"<id {t}>".encode()


def _pieces(enc, toks: list[int]) -> str:
    return " ".join(f"{show_bytes(_token_bytes(enc, t))}({t})" for t in toks)


def _incomplete_tail(b: bytes) -> bytes:
    """The trailing bytes of ``b`` that start a UTF-8 character not finished in ``b``."""
    for k in range(1, min(4, len(b)) + 1):
        c = b[-k]
        if c & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return b[-k:] if need > k else b""
    return b""


def _lead_continuations(b: bytes) -> int:
    """Number of leading UTF-8 continuation bytes (a match starting inside a character)."""
    n = 0
    while n < len(b) and b[n] & 0xC0 == 0x80:
        n += 1
    return n


# --------------------------------------------------------------------------- commands


def _split_line(index) -> str:
    splits = sorted({s["split"] for s in index.meta["shards"]})
    return (f"index         {index.folder} (split {' + '.join(splits)}, "
            f"{index.n_tokens:,} tokens, {index.tokenizer.short()})")


def _build(args: argparse.Namespace) -> int:
    from tokenmill.ngram.counts import build_counts
    from tokenmill.ngram.index import build_index

    orders = parse_orders(args.orders) if args.counts else None  # checked before any work
    if args.no_verify:
        print("shard verification is off (--no-verify)", file=sys.stderr)
    split = None if args.split == "all" else args.split
    # a URL: built in a local folder, then uploaded with meta.json (the index's record) last
    with storage.output_folder(args.out, "meta.json") as out:
        s = build_index(args.manifest, out, split=split, progress=not args.quiet,
                        verify=not args.no_verify)
        c = build_counts(out, out / "counts", orders=orders) if args.counts else None
    rows = [("split", args.split), ("tokens", f"{s['tokens']:,}"),
            ("parts / shards", f"{s['parts']} / {s['shards']}"),
            ("build time", f"{s['seconds']:.2f} s"),
            ("build speed", f"{s['tokens'] / s['seconds'] / 1e6:.2f} M tokens/s"),
            ("index size", f"{s['bytes'] / 2**20:.1f} MiB ({s['bytes_per_token']:.2f} "
                           "bytes/token)")]
    if c is not None:
        rows += [("counts orders", f"{orders[0]}-{orders[-1]}" if orders == list(
                     range(orders[0], orders[-1] + 1)) else ",".join(map(str, orders))),
                 ("counts build time", f"{c['seconds']:.2f} s"),
                 ("counts size", f"{c['bytes'] / 2**20:.1f} MiB ({c['bytes'] / s['tokens']:.2f}"
                                 f" bytes/token, {c['bytes'] / s['bytes']:.2f}x the index)")]
        rows += [(f"order {n} contexts", f"{v:,} stored (seen >= 2 times), "
                  f"{c['followers'][n]:,} followers") for n, v in c["contexts"].items()]
    w = max(len(r[0]) for r in rows)
    shown = storage.redact(args.out)
    print(f"suffix-array index -> {shown}" + (f" (counts -> {shown}/counts)"
                                                 if args.counts else ""))
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    return 0


def _query(args: argparse.Namespace):
    """(index, encoding, query tokens) after printing the index line and token pieces."""
    from tokenmill.ngram.index import SuffixArrayIndex
    from tokenmill.tokenizers import load_checked

    index = SuffixArrayIndex(args.index)
    enc = load_checked(index.tokenizer, f"n-gram index {index.folder}")
    toks = enc.encode_ordinary(args.text)
    print(_split_line(index))
    print(f"query         {args.text!r}: {len(toks)} tokens")
    print(f"pieces        {_pieces(enc, toks)}")
    return index, enc, toks


def _leading_space(index, enc, text: str) -> None:
    """Print the count of the leading-space form of a query that has none."""
    if text[:1].isspace() or not text:
        return
    sp = enc.encode_ordinary(" " + text)
    print(f"with a leading space {(' ' + text)!r}: count {index.count(sp):,} "
          f"({len(sp)} tokens: {_pieces(enc, sp)})")


def _count(args: argparse.Namespace) -> int:
    index, enc, toks = _query(args)
    print(f"count         {index.count(toks):,}")
    _leading_space(index, enc, args.text)
    return 0


def _longest(args: argparse.Namespace) -> int:
    index, enc, toks = _query(args)
    m = index.longest_match(toks, k=args.k)
    matched = toks[len(toks) - m.length:] if m.length else []
    mb = b"".join(_token_bytes(enc, t) for t in matched)
    print(f"match length  {m.length} of {len(toks)} tokens ({m.count:,} occurrences)")
    lead = _lead_continuations(mb)
    note = (f"  (starts inside a character: its first {lead} byte(s) continue one)"
            if lead else "")
    print(f"matched text  {show_bytes(mb)}{note}")
    _leading_space(index, enc, args.text)
    tail = _incomplete_tail(b"".join(_token_bytes(enc, t) for t in toks))
    total = max(m.count, 1)  # every occurrence has a follower (EOT at document ends)
    print("next tokens:")
    for t, c in zip(m.next_tokens.tolist(), m.next_counts.tolist(), strict=True):
        if t < 0:
            break
        tb = _token_bytes(enc, t)
        line = f"  {c:>8d}  {c / total:6.1%}  {t:>6d}  {show_bytes(tb)}"
        if tail and not _incomplete_tail(tail + tb) and tail + tb != tail:
            line += f"  (completes {show_bytes(tail + tb)})"
        print(line)
    return 0


def _prob(args: argparse.Namespace) -> int:
    from tokenmill.ngram.counts import NGramCountsModel

    index, enc, toks = _query(args)
    model = NGramCountsModel.load(Path(args.index) / "counts", index=index)
    if not toks:
        raise ValueError("the context is empty: give some text")
    ids, probs = model.next_tokens(toks, k=args.k)
    o = model.orders.tolist()
    print(f"counts model  orders {o[0]}-{o[-1]}, interpolated (beta {model.beta:g})")
    print("next tokens:")
    for t, p in zip(ids.tolist(), probs.tolist(), strict=True):
        print(f"  {p:8.4f}  {t:>6d}  {show_bytes(_token_bytes(enc, t))}")
    return 0


def _pairs(args: argparse.Namespace) -> int:
    from tokenmill.ngram.observed import ObservedPairs
    from tokenmill.tokenizers.legality import LegalityTable

    if args.no_verify:
        print("shard verification is off (--no-verify)", file=sys.stderr)
    table = None
    if args.table:  # opened before the shards are counted: a wrong path fails at once
        from tokenmill.manifests.verify import read_manifest
        from tokenmill.tokenizers import load_checked

        mpath, man = read_manifest(args.manifest)
        load_checked(man.tokenizer, str(mpath))
        table = LegalityTable.load(args.table, encoding=man.tokenizer)
    split = None if args.split == "all" else args.split
    obs = ObservedPairs.from_manifest(args.manifest, split=split, ray_address=args.ray_address,
                                      num_cpus=args.num_cpus, verify=not args.no_verify)
    from tokenmill.tokenizers import load_checked

    enc = load_checked(obs.identity, str(args.manifest))
    print(f"adjacent pairs  {obs.total():,} ({len(obs):,} distinct), split {args.split}")
    for a, b, c in obs.top(args.top):
        print(f"  {c:>10,d}  {show_bytes(_token_bytes(enc, a))}({a}) -> "
              f"{show_bytes(_token_bytes(enc, b))}({b})")
    if table is None:
        return 0
    bad = obs.check(table)
    print(f"legality check  {len(bad):,} observed pair(s) marked impossible by {args.table}")
    for v in bad[:20]:
        print(f"  {v}")
    return 1 if bad else 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``tokenmill ngram ...``."""
    p = sub.add_parser("ngram", help="n-gram side models: suffix-array index, counts")
    nsub = p.add_subparsers(dest="ngram_command", required=True, metavar="COMMAND",
                            help="the command to run")
    b = nsub.add_parser("build", help="build the suffix-array index of a manifest's shards")
    b.add_argument("manifest", help="manifest.json or its folder (a path or an s3://, gs:// "
                   "or hf:// URL)")
    add_output_argument(b, required=True, dest="out", help="index folder to write (a path or "
                        "an s3:// or gs:// URL)",
                        aliases=("--out",))
    b.add_argument("--split", default="train", choices=["train", "val", "all"])
    b.add_argument("--counts", action="store_true",
                   help="also build the compact n-gram counts model into OUT/counts")
    b.add_argument("--orders", default="2-8", help="counts orders in 2..32, e.g. 2-8 or 2,3,5")
    b.add_argument("--no-verify", action="store_true",
                   help="do not check the shards' sha256 against the manifest")
    add_quiet_argument(b, help="no progress bars")
    b.set_defaults(func=_build)
    c = nsub.add_parser("count", help="count a text's tokens as one n-gram")
    c.add_argument("index", help="index folder (tokenmill ngram build)")
    c.add_argument("text", help="the text whose tokens are counted as one n-gram")
    c.set_defaults(func=_count)
    lg = nsub.add_parser("longest", help="longest suffix of a text found in the index")
    lg.add_argument("index", help="index folder (tokenmill ngram build)")
    lg.add_argument("text", help="the text whose longest suffix in the index is looked up")
    lg.add_argument("-k", type=positive_int, default=5, help="next tokens to show")
    lg.set_defaults(func=_longest)
    pr = nsub.add_parser("prob", help="next-token probabilities of the counts model")
    pr.add_argument("index", help="index folder built with --counts")
    pr.add_argument("text", help="the context")
    pr.add_argument("-k", type=positive_int, default=10, help="next tokens to show")
    pr.set_defaults(func=_prob)
    pa = nsub.add_parser("pairs", help="count a manifest's adjacent token pairs (Ray); with "
                         "--table, check that none is marked impossible (legality check)")
    pa.add_argument("manifest", help="manifest.json or its folder")
    pa.add_argument("--table", help="a saved legality table (file or folder)")
    pa.add_argument("--split", default="all", choices=["train", "val", "all"])
    pa.add_argument("--top", type=int, default=10, help="most frequent pairs to show")
    pa.add_argument("--ray-address", default=None)
    pa.add_argument("--num-cpus", type=positive_int, default=2)
    pa.add_argument("--no-verify", action="store_true",
                    help="do not check the shards' sha256 against the manifest")
    pa.set_defaults(func=_pairs)
    add_lem_command(nsub)  # tokenmill ngram lem (tokenmill/ngram/precompute_commands.py)
    add_features_command(nsub)  # tokenmill ngram features (ngramfeat_commands.py)
