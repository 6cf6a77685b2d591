"""CPU ablation of the trainer's side inputs on the quickstart datamix.

Four runs of the same tiny model for the same number of steps, same seed and data order:

1. baseline;
2. + prefix auxiliary loss (longest-token prefix of each target, weight ``--prefix-weight``);
3. + LEM feature (online longest-exact-match predictor in its own process, ``LEMStream``);
4. + legality mask at evaluation (the baseline's training; validation renormalized over the
   tokens the GPT-2 tokenizer can emit after the previous token).

Prints one table: final validation loss (nats/token) without and with the mask, the change
against the baseline, wall time, tokens/s, and for the LEM run the share of step time the
trainer spent waiting for the predictor (target < 10%).

The legality rows come from :class:`tokenmill.tokenizers.legality.LegalityTable`: either a
saved full table (``--legality FILE``) or, by default, built analytically for just the
previous-token ids that occur in the validation set (other rows allow everything; they are
never looked up).

Usage::

    python benchmarks/ablation_cpu.py [--data out/quickstart] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "data" / "tiktoken"))

from tokenmill.train import train as T  # noqa: E402
from tokenmill.train.batches import data_tokenizer, validation_set  # noqa: E402
from tokenmill.train.side import save_rows_table  # noqa: E402


def partial_legality(cfg: T.TrainConfig, out: Path) -> Path:
    """Packed gpt2 legality rows for the val set's previous tokens (others: all allowed)."""
    ident = data_tokenizer(cfg.data)
    val = validation_set(cfg)
    prev = np.unique(val[:, :-1].numpy())
    t0 = time.perf_counter()
    path = save_rows_table(ident.name, prev, out / f"{ident.name}_val_rows.legality")
    print(f"legality rows for {len(prev)} previous tokens built in "
          f"{time.perf_counter() - t0:.1f} s")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / "out" / "quickstart"),
                    help="curation or training-mix manifest (default: the quickstart output)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--val-tokens", type=int, default=16384)
    ap.add_argument("--prefix-weight", type=float, default=0.3)
    ap.add_argument("--legality", default=None, help="saved LegalityTable (default: partial)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--mask-from-baseline", action="store_true",
                    help="3 trainings: the legality row is the baseline evaluated with the mask "
                    "(same training by construction; saves one run)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="tokenmill-ablation-"))
    out.mkdir(parents=True, exist_ok=True)

    def cfg(name: str, **kw) -> T.TrainConfig:
        return T.TrainConfig(
            data=args.data, out_dir=str(out / name), model="tiny", seq_len=args.seq_len,
            batch_size=args.batch_size, steps=args.steps, lr=args.lr, warmup_steps=10,
            val_every=max(1, args.steps // 4), val_tokens=args.val_tokens,
            num_threads=args.threads, progress=False, device="cpu", **kw)

    legality = args.legality or str(partial_legality(cfg("probe"), out))
    runs = [
        ("baseline", cfg("baseline")),
        ("+ prefix aux loss", cfg("prefix", prefix_aux_weight=args.prefix_weight)),
        ("+ LEM feature", cfg("lem", lem=True)),
        ("+ legality mask (eval)", cfg("mask", legality=legality)),
    ]
    if args.mask_from_baseline:
        # the mask changes evaluation only: train once, evaluate with and without it
        runs = [("baseline", cfg("baseline", legality=legality))] + runs[1:3]
    rows = []
    for name, c in runs:
        print(f"--- {name}", flush=True)
        t0 = time.perf_counter()
        r = T.train(c)
        wall = time.perf_counter() - t0
        last = r.val[-1]
        row = (name, r.val[0]["val_loss"], last["val_loss"],
               last.get("val_loss_masked", float("nan")),
               int(last.get("masked_targets", 0)), wall, r.tokens_per_s,
               r.lem_wait_frac if c.lem else float("nan"))
        rows.append(row)
    if args.mask_from_baseline:
        rows.append(("+ legality mask (eval)", *rows[0][1:]))
    base = rows[0][2]
    print()
    print(f"tiny GPT ({args.steps} steps x {args.batch_size} x {args.seq_len} tokens, "
          f"data {args.data})")
    hdr = (f"{'run':<24} {'val@0':>7} {'val':>7} {'d vs base':>9} {'val masked':>10} "
           f"{'masked tgt':>10} {'wall s':>7} {'tok/s':>7} {'LEM wait':>8}")
    print(hdr)
    print("-" * len(hdr))
    for name, v0, v, vm, bad, wall, tps, lw in rows:
        d = (vm if name.startswith("+ legality") else v) - base
        lw_s = f"{lw:.1%}" if lw == lw else "-"
        vm_s = f"{vm:.4f}" if vm == vm else "-"
        print(f"{name:<24} {v0:>7.4f} {v:>7.4f} {d:>+9.4f} {vm_s:>10} {bad:>10} "
              f"{wall:>7.1f} {tps:>7.0f} {lw_s:>8}")
    print("\n'd vs base' compares the final val loss (the masked one for the legality row) "
          "with the baseline's final val loss; the prefix row's val loss is the plain "
          "next-token loss (the auxiliary term only trains).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
