"""CLI: ``tokenmill ngram features MIX -o DIR``, the n-gram side channel of a training mix.

The stream is the LEM side channel's (:func:`tokenmill.ngram.sidechannel.mix_stream`).
For ``--split train`` the counts of a position in chunk ``c`` come from the stream before
the chunk; for ``--split val`` from the whole train stream of the same mix (same
``--seq-len``, ``--batch-size``, ``--remainder``), never from val tokens
(:func:`tokenmill.ngram.ngramfeat.precompute_ngram`). Position ``p``'s candidates predict
stream token ``p + 1``. The output (read by :class:`tokenmill.train.ngramside.NgramSideChannel`)
is written and listed in the mix manifest as
:func:`tokenmill.ngram.sidechannel.write_ngram_side_channel` describes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tokenmill.cliargs import add_quiet_argument
from tokenmill.ngram.precompute_commands import add_stream_arguments, positive_int
from tokenmill.ngram.sidechannel import (
    check_out_folder,
    mix_stream,
    write_ngram_side_channel,
)


def parse_orders(text: str) -> list[int]:
    """``"2-8"`` or ``"2,3,5"`` -> sorted orders in 2..32.

    Raises:
        ValueError: naming ``--orders`` and the text.
    """
    from tokenmill.ngram.counts import check_orders

    try:
        if "-" in text:
            a, b = text.split("-", 1)
            out = list(range(int(a), int(b) + 1))
        else:
            out = [int(x) for x in text.split(",")]
        return check_orders(out)
    except ValueError as e:
        raise ValueError(f"--orders {text!r}: expected a range like 2-8 or a list like "
                         f"2,3,5 of orders in 2..32 ({e})") from None


def _features(args: argparse.Namespace) -> int:
    from tokenmill.ngram.ngramfeat import default_chunk_tokens, feature_stats, precompute_ngram

    orders = parse_orders(args.orders)  # checked before any work
    check_out_folder(args.out)
    if args.split == "val" and args.chunk_tokens:
        raise ValueError("--chunk-tokens applies to --split train only (validation counts "
                         "come from the whole training stream)")
    kw = {"seq_len": args.seq_len, "batch_size": args.batch_size,
          "remainder": args.remainder, "verify": not args.no_verify}
    tokens, m, mpath = mix_stream(args.mix, split=args.split, **kw)
    history = None
    if args.split == "val":  # counts from the whole train stream, never from val tokens
        history = mix_stream(args.mix, split="train", **kw)[0]
    if args.no_verify:
        print("shard verification is off (--no-verify)", file=sys.stderr)
    eot, n_vocab = int(m.tokenizer.eot_token), int(m.tokenizer.n_vocab)
    chunk = None if history is not None else (args.chunk_tokens or
                                              default_chunk_tokens(tokens.size))
    t0 = time.perf_counter()
    cand, logp = precompute_ngram(tokens, orders=orders, m=args.m, chunk_tokens=chunk,
                                  beta=args.beta, eot=eot, n_vocab=n_vocab, history=history,
                                  progress=None if args.quiet else
                                  (lambda s: print(s, file=sys.stderr, flush=True)))
    secs = time.perf_counter() - t0
    out = Path(args.out)
    settings = {"split": args.split, "seq_len": args.seq_len, "batch_size": args.batch_size,
                "remainder": args.remainder, "orders": orders, "beta": args.beta, "m": args.m,
                "chunk_tokens": int(chunk if chunk is not None else tokens.size), "eot": eot}
    files = write_ngram_side_channel(out, mpath, tokens, cand, logp, settings=settings,
                                     n_vocab=n_vocab, shard_tokens=args.shard_tokens)
    nbytes = sum((out / f[k]).stat().st_size for f in files for k in ("cand", "logp"))
    st = feature_stats(tokens, cand)
    print(f"n-gram side channel ({args.split}) -> {out}: {tokens.size:,} tokens, "
          f"{nbytes / max(tokens.size, 1):.2f} bytes/token, precompute {secs:.2f} s "
          f"({tokens.size / max(secs, 1e-9) / 1e6:.3f} M tokens/s), top-{args.m} recall "
          f"{st['recall']:.1%}, top-1 accuracy {st['top1']:.1%} (over the "
          f"{st['covered']:.1%} of positions with history)")
    return 0


def _beta(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, not {text!r}")
    return v


def add_features_command(nsub: argparse._SubParsersAction) -> None:
    """Register ``ngram features`` on the ``ngram`` subparsers."""
    p = nsub.add_parser("features", help="precompute the n-gram side channel of a training "
                        "mix (top-m candidates + log-probabilities per position)")
    add_stream_arguments(p)
    p.add_argument("-m", type=positive_int, default=8, help="candidates per position")
    p.add_argument("--orders", default="2-8", help="interpolated orders, e.g. 2-8 or 2,3,5")
    p.add_argument("--beta", type=_beta, default=1.0, help="interpolation prior")
    p.add_argument("--chunk-tokens", type=positive_int, default=None,
                   help="positions of chunk c use the counts of chunks < c (train split; "
                   "default max(tokens / 16, min(2**20, tokens / 4)))")
    p.add_argument("--shard-tokens", type=positive_int, default=100_000_000)
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks")
    add_quiet_argument(p, help="no per-chunk lines")
    p.set_defaults(func=_features)
