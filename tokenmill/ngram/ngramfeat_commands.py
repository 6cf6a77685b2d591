"""``tokenmill ngram features MIX -o DIR``: the n-gram side channel of a training mix.

The stream is the LEM side channel's (:func:`tokenmill.ngram.precompute_commands.mix_stream`:
the MixLoader rows of ``seq_len + 1`` tokens, global batch rows per step, back to back).
For ``--split train`` the counts of a position in chunk ``c`` come from the stream before
the chunk; for ``--split val`` from the whole train stream of the same mix (same
``--seq-len``, ``--batch-size``, ``--remainder``), never from val tokens.

Output (read by :class:`tokenmill.train.ngramside.NgramSideChannel`), written atomically,
aligned position for position with the stream (row ``g`` of ``seq_len + 1`` tokens at
``g * (seq_len + 1)``); position ``p``'s candidates predict stream token ``p + 1``, sorted by
probability (ties: smaller id first):

* ``ngram_cand_NNNNNN.npy``: ``[n, m]`` candidate next tokens, uint16 with 65,535 for
  "none" when the vocabulary has at most 65,535 ids, else int32 with -1;
* ``ngram_logp_NNNNNN.npy``: ``[n, m]`` float16 natural-log probabilities (-inf: none);
* ``ngram.json``: the settings, the mix's identity sha256, the stream's sha256 and every
  file with its tokens and sha256.

A re-run into the same folder leaves exactly its own files (shards of an earlier run that
this one did not write are removed once ``ngram.json`` is written:
:func:`tokenmill.ngram.precompute_commands.remove_stale_shards`).

The side channel is then listed in the mix manifest
(:func:`tokenmill.manifests.mixschema.register_side_channel`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from tokenmill.atomic import atomic_write_bytes, atomic_write_text, sha256_bytes
from tokenmill.cliargs import add_quiet_argument
from tokenmill.ngram.precompute_commands import (
    add_stream_arguments,
    check_out_folder,
    mix_stream,
    positive_int,
    remove_stale_shards,
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


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def write_ngram_shards(out: Path, cand: np.ndarray, logp: np.ndarray, *, n_vocab: int,
                       shard_tokens: int) -> list[dict]:
    """Write ``ngram_cand_*.npy`` / ``ngram_logp_*.npy`` shards of ``shard_tokens``
    positions (module docstring); returns their ``files`` entries."""
    small = n_vocab <= 65535
    files = []
    for i, a in enumerate(range(0, max(1, cand.shape[0]), shard_tokens)):
        c = cand[a:a + shard_tokens]
        c = np.where(c < 0, 65535, c).astype(np.uint16) if small else c.astype(np.int32)
        lb = logp[a:a + shard_tokens].astype(np.float16)
        cb, pb = _npy(c), _npy(lb)
        names = (f"ngram_cand_{i:06d}.npy", f"ngram_logp_{i:06d}.npy")
        atomic_write_bytes(out / names[0], cb)
        atomic_write_bytes(out / names[1], pb)
        files.append({"cand": names[0], "logp": names[1], "start": a, "tokens": int(c.shape[0]),
                      "cand_sha256": sha256_bytes(cb), "logp_sha256": sha256_bytes(pb)})
    return files


def register(mix_path: Path, out: Path, split: str, files: list[dict]) -> None:
    """List the side channel at ``out`` in the mix manifest (paths relative to its folder)."""
    from tokenmill.atomic import sha256_file
    from tokenmill.manifests.mixschema import (
        SideChannelFile,
        SideChannelRef,
        register_side_channel,
    )

    base = mix_path.resolve().parent

    def rel(p: Path) -> str:
        return Path(os.path.relpath(p.resolve(), base)).as_posix()

    listed = [SideChannelFile(path=rel(out / f[kind]), sha256=f[f"{kind}_sha256"])
              for f in files for kind in ("cand", "logp")]
    register_side_channel(mix_path, SideChannelRef(
        kind="ngram-side-channel", split=split, path=rel(out / "ngram.json"),
        sha256=sha256_file(out / "ngram.json"), files=listed))


def _features(args: argparse.Namespace) -> int:
    from tokenmill.manifests.mixschema import mix_identity_sha256
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
    out.mkdir(parents=True, exist_ok=True)
    files = write_ngram_shards(out, cand, logp, n_vocab=n_vocab, shard_tokens=args.shard_tokens)
    meta = {"kind": "ngram-side-channel", "mix": str(mpath),
            "mix_sha256": mix_identity_sha256(mpath), "split": args.split,
            "seq_len": args.seq_len, "batch_size": args.batch_size,
            "remainder": args.remainder, "orders": orders, "beta": args.beta, "m": args.m,
            "chunk_tokens": int(chunk if chunk is not None else tokens.size), "eot": eot,
            "tokens": int(tokens.size),
            "stream_sha256": sha256_bytes(tokens.astype("<i4").tobytes()), "files": files}
    atomic_write_text(out / "ngram.json", json.dumps(meta, indent=1) + "\n")
    remove_stale_shards(out, ("ngram_cand_*.npy", "ngram_logp_*.npy"), files, ("cand", "logp"))
    register(mpath, out, args.split, files)
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
