"""CLI: ``tokenmill mix plan|build`` and ``tokenmill shards export``.

* ``tokenmill mix plan SPEC`` prints the plan table (per source: spec weight, available
  tokens, max epochs, requested tokens and share, epochs needed, granted tokens and epochs,
  effective share, shortfall; units on a second header line, shares in %), a line for each
  share that differs from the spec's saying why, and any warnings; nothing is written.
* ``tokenmill mix build SPEC -o OUT.json`` plans and writes the
  training-mix manifest (paths inside it are relative to OUT's folder, or URLs for
  shards in another bucket), printing the same table. SPEC, the manifests and OUT may be
  URLs (:mod:`tokenmill.objectcache`).
* ``tokenmill shards export --format FORMAT MIX.json -o DIR`` writes the mix as
  modded-nanogpt, Megatron-LM / NeMo, OLMo or Hugging Face files
  (:mod:`tokenmill.manifests.export`): exactly the token stream ``MixLoader`` yields for
  ``--seq-len`` / ``--batch-size``, with ``export.json`` listing every file's sha256.

All three check every shard they read against its manifest's sha256 first
(:func:`tokenmill.manifests.verify.open_shards`) and refuse a stale, truncated or
half-written one, naming it; ``--no-verify`` skips only the sha256 comparison and says so.
"""

from __future__ import annotations

import argparse
import sys

#: the export formats (tokenmill.manifests.export.FORMATS; kept here so --help stays light)
EXPORT_FORMATS = ("modded-nanogpt", "megatron", "olmo", "hf")

NO_VERIFY_LINE = ("shard verification is off (--no-verify): sha256 of shards and sidecars "
                  "not compared with their manifest")


def _verify(args: argparse.Namespace) -> bool:
    """False (and a printed line saying so) under ``--no-verify``."""
    if args.no_verify:
        print(NO_VERIFY_LINE, file=sys.stderr)
    return not args.no_verify


def _plan(args: argparse.Namespace) -> int:
    from tokenmill.manifests.mix import plan_spec_file

    plan = plan_spec_file(args.spec, verify=_verify(args))
    print(plan.table())
    return 0


def _build(args: argparse.Namespace) -> int:
    from tokenmill.manifests.mix import build_mix, plan_table

    m = build_mix(args.spec, args.output, verify=_verify(args))
    print(plan_table(m))
    print(f"wrote {args.output}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from tokenmill.manifests.export import DEFAULT_SEQ_LEN, export_mix
    from tokenmill.manifests.export_plan import LoaderSettings

    splits = tuple(s for s in args.splits.split(",") if s)
    bad = [s for s in splits if s not in ("train", "val")]
    if bad:
        print(f"unknown split(s) {bad}; use train and/or val", file=sys.stderr)
        return 2
    # hf: --seq-len packs the loader's rows, one per dataset row; without it, one document
    settings = LoaderSettings(seq_len=args.seq_len or DEFAULT_SEQ_LEN,
                              batch_size=args.batch_size, remainder=args.remainder,
                              packed=args.format == "hf" and args.seq_len is not None)
    summary = export_mix(args.manifest, args.output, args.format,
                         shard_tokens=args.shard_tokens, splits=splits, settings=settings,
                         verify=_verify(args))
    print(f"{'source':28s} {'tokens':>12s} {'docs':>8s} {'share':>7s} {'eff weight':>10s}")
    for name, s in summary["sources"].items():
        print(f"{name:28s} {s['tokens']:12,d} {s['documents']:8,d} {s['share']:7.4f} "
              f"{s['effective_weight']:10.4f}")
    print(f"{len(summary['files'])} file(s) in {args.output}")
    return 0


NO_VERIFY_HELP = ("skip comparing each shard's and sidecar's sha256 with the manifest "
                  "(presence and headers are still checked)")


def add_mix_commands(sub: argparse._SubParsersAction, shards_sub: argparse._SubParsersAction
                     ) -> None:
    """Register ``tokenmill mix`` on ``sub`` and ``export`` on the ``shards`` group."""
    mx = sub.add_parser("mix", help="plan and build a training mix from a mix spec")
    msub = mx.add_subparsers(dest="mix_command", required=True, metavar="COMMAND",
                            help="the command to run")
    p = msub.add_parser("plan", help="print the training-mix plan table; writes nothing")
    p.add_argument("spec", help="the mix spec YAML (e.g. manifests/mix-example.yaml)")
    p.add_argument("--no-verify", action="store_true", help=NO_VERIFY_HELP)
    p.set_defaults(func=_plan)
    b = msub.add_parser("build", help="write the training-mix manifest")
    b.add_argument("spec", help="the mix spec YAML (e.g. manifests/mix-example.yaml; a path "
                   "or a URL)")
    b.add_argument("-o", "--output", required=True, help="training-mix manifest to write "
                   "(.json; a path or an s3:// or gs:// URL)")
    b.add_argument("--no-verify", action="store_true", help=NO_VERIFY_HELP)
    b.set_defaults(func=_build)

    e = shards_sub.add_parser("export", help="write a training mix as the files another "
                                             "trainer reads (docs/exports.md)")
    e.add_argument("manifest", help="training-mix manifest (tokenmill mix build; a path or "
                   "a URL)")
    e.add_argument("--format", required=True, choices=list(EXPORT_FORMATS),
                   help="modded-nanogpt (uint16 .bin shards), megatron (Megatron-LM / NeMo "
                        ".bin/.idx), olmo (Dolma .npy + .csv.gz), hf (parquet input_ids + "
                        "dataset card)")
    e.add_argument("-o", "--output", required=True, help="output folder (a path or an s3:// "
                   "or gs:// URL)")
    e.add_argument("--shard-tokens", type=int, default=100_000_000,
                   help="most tokens per shard (default 10^8, as FineWeb's)")
    e.add_argument("--splits", default="train,val", help="comma list of train,val")
    e.add_argument("--seq-len", type=int, default=None,
                   help="loader row length T: the train files hold the token stream of "
                        "MixLoader(seq_len=T, batch_size=B) (default 2048); with --format hf, "
                        "one dataset row per loader row of T + 1 tokens instead of one per "
                        "document")
    e.add_argument("--batch-size", type=int, default=1, help="loader global rows per step B "
                                                               "(default 1)")
    e.add_argument("--remainder", choices=["carry", "drop"], default="carry",
                   help="loader remainder mode (default carry)")
    e.add_argument("--no-verify", action="store_true", help=NO_VERIFY_HELP)
    e.set_defaults(func=_export)
