"""CLI: ``tokenmill ngram lem MIX -o DIR``, the LEM side channel of a training mix, ahead of
time: the features of :func:`tokenmill.ngram.precompute.precompute_lem` over the mix's
stream (:func:`tokenmill.ngram.sidechannel.mix_stream`: the rows
:class:`tokenmill.train.data.MixLoader` yields for the mix, its seed and the given
``--seq-len``, global ``--batch-size`` and ``--remainder``), written and listed in the mix
manifest as :func:`tokenmill.ngram.sidechannel.write_lem_side_channel` describes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tokenmill.cliargs import add_output_argument
from tokenmill.ngram.sidechannel import check_out_folder, mix_stream, write_lem_side_channel


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (else a usage error naming the value)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, not {text!r}")
    return v


def _lem(args: argparse.Namespace) -> int:
    from tokenmill.ngram.precompute import precompute_lem

    check_out_folder(args.out)
    t0 = time.perf_counter()
    tokens, m, mpath = mix_stream(args.mix, split=args.split, seq_len=args.seq_len,
                                  batch_size=args.batch_size, remainder=args.remainder,
                                  verify=not args.no_verify)
    if args.no_verify:
        print("shard verification is off (--no-verify)")
    t1 = time.perf_counter()
    ml, nt = precompute_lem(tokens, k=args.k, mode="position", window=args.window,
                            eot=int(m.tokenizer.eot_token), max_len=args.max_len,
                            workers=args.workers, ray_address=args.ray_address)
    t2 = time.perf_counter()
    out = Path(args.out)
    settings = {"split": args.split, "seq_len": args.seq_len, "batch_size": args.batch_size,
                "remainder": args.remainder, "mode": "position", "k": args.k,
                "window": args.window, "max_len": args.max_len,
                "eot": int(m.tokenizer.eot_token)}
    files = write_lem_side_channel(out, mpath, tokens, ml, nt, settings=settings,
                                   n_vocab=int(m.tokenizer.n_vocab),
                                   shard_tokens=args.shard_tokens, len_dtype=args.len_dtype)
    secs = t2 - t1
    print(f"LEM side channel -> {out}: {tokens.size:,} tokens, {len(files)} shards, "
          f"precompute {secs:.2f} s ({tokens.size / max(secs, 1e-9) / 1e6:.2f} M tokens/s, "
          f"{args.workers} workers), stream read {t1 - t0:.2f} s; "
          f"match > 0 at {(ml > 0).mean():.1%}; listed in {mpath}")
    return 0


def add_stream_arguments(p: argparse.ArgumentParser) -> None:
    """The options every side-channel command shares: the mix, ``-o`` and the MixLoader
    stream's split and geometry (:func:`tokenmill.ngram.sidechannel.mix_stream`)."""
    p.add_argument("mix", help="training-mix manifest (tokenmill mix build)")
    add_output_argument(p, required=True, dest="out", help="output folder",
                        aliases=("--out",))
    p.add_argument("--split", default="train", choices=["train", "val"])
    p.add_argument("--seq-len", type=positive_int, default=2048, help="MixLoader seq_len (T)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="MixLoader global rows per step")
    p.add_argument("--remainder", default="carry", choices=["carry", "drop"])


def add_lem_command(nsub: argparse._SubParsersAction) -> None:
    """Register ``ngram lem`` on the ``ngram`` subparsers."""
    p = nsub.add_parser("lem", help="precompute the LEM side channel of a training mix")
    add_stream_arguments(p)
    p.add_argument("-k", type=int, default=4, help="candidate next tokens per position")
    p.add_argument("--window", type=int, default=4_000_000, help="visible history (0: all)")
    p.add_argument("--max-len", type=int, default=0, help="match length cap (0: none)")
    p.add_argument("--len-dtype", default="uint8", choices=["uint8", "uint16"])
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--workers", type=int, default=1, help="Ray workers (1: in-process)")
    p.add_argument("--ray-address", default=None)
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks")
    p.set_defaults(func=_lem)
