"""CLI: ``tokenmill run DATAMIX``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill import storage
from tokenmill.cliargs import counted

if TYPE_CHECKING:
    from tokenmill.pipeline.config import DatamixConfig
    from tokenmill.pipeline.report.plots import PlotWorkers
    from tokenmill.pipeline.run.executor import RunResult


def _run(args: argparse.Namespace) -> int:
    from tokenmill.failures import disk_full_line
    from tokenmill.pipeline.config import load_datamix
    from tokenmill.tokenizers import tokenizer_label

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    datamix = args.datamix
    cfg = load_datamix(datamix, data_root=args.data_root, output_dir=args.output)
    local = [s for s in cfg.sources if s.path is not None]
    if (local and args.fallback and "://" not in (cfg.data_root or "")
            and not Path(cfg.data_root or ".").is_dir()):
        print(f"tokenmill: data root {cfg.data_root} is missing (no ../shared/data beside "
              f"this checkout); running the Hub datamix {args.fallback} instead.",
              file=sys.stderr)
        datamix = args.fallback
        cfg = load_datamix(datamix, data_root=args.data_root, output_dir=args.output)
    print(storage.redact(
        f"tokenmill run {datamix}: {counted(len(cfg.sources), 'source')}, tokenizer "
        f"{tokenizer_label(cfg.tokenizer)}, data root "
        f"{cfg.data_root or '(not set: the current folder)'}, output {cfg.output_dir}"))
    try:
        return _run_locked(args, cfg)
    except Exception as e:  # a full disk is named by the output folder, in one line
        line = None if os.environ.get("TOKENMILL_DEBUG") == "1" else disk_full_line(
            e, Path(cfg.output_dir).resolve())
        if line is None:
            raise
        print(f"tokenmill: {line}", file=sys.stderr)
        return 2


def _run_locked(args: argparse.Namespace, cfg: DatamixConfig) -> int:
    """The run, its report and text, holding the output folder's lock."""
    from tokenmill.outputlock import output_lock
    from tokenmill.pipeline.read.license import LicenseError
    from tokenmill.pipeline.read.sources import SourceError
    from tokenmill.pipeline.report.plots import PlotWorkers
    from tokenmill.pipeline.run.executor import run_datamix, tokenizer_change

    # the lock covers the report and the text written after the manifest; the report's
    # plot workers load matplotlib while the pipeline runs
    with output_lock(cfg.output_dir), (
            contextlib.nullcontext() if args.no_report else PlotWorkers(2)) as plot_workers:
        change = tokenizer_change(cfg)
        if change and args.strict:
            print(f"tokenmill: {change} (refused under --strict)", file=sys.stderr)
            return 2
        if change:
            print(f"tokenmill: warning: {change}", file=sys.stderr)
        early: dict[str, Future] = {}  # plots drawn while the run's last phases go on
        try:
            res = run_datamix(cfg, ray_address=args.ray_address, num_cpus=args.num_cpus,
                              progress=not args.quiet,
                              on_measures=None if plot_workers is None else
                              lambda folder: early.update(draw_rules(folder, plot_workers)))
        except (SourceError, LicenseError) as e:
            print(f"tokenmill: {e}", file=sys.stderr)
            return 2
        return _finish(args, cfg, res, plot_workers, early)


def draw_rules(ahead: Path, workers: PlotWorkers) -> dict[str, Future]:
    """Submit the report's rules plot of the running run to ``workers``, from the rule
    measures in ``ahead/measures``, drawn into ``ahead`` (the report moves it into place):
    ``{png name: future}``, empty when there are no measures."""
    from tokenmill.pipeline.report.tuning import rules_spec

    spec = rules_spec(ahead, {}, measures=ahead / "measures")
    return {} if spec is None else {spec.png: workers.submit(ahead / spec.png, spec)}


def _finish(args: argparse.Namespace, cfg: DatamixConfig, res: RunResult,
            plot_workers: PlotWorkers | None, early: dict[str, Future]) -> int:
    """After the pipeline: the summary, the report (drawn by ``plot_workers``; ``early``:
    its plots already submitted, by PNG name), the Hub-layout text, the output paths;
    exit status 2 for warnings under ``--strict``."""
    from tokenmill import storage
    from tokenmill.manifests.summary import summary_table
    from tokenmill.pipeline.run.stage_list import cut_lines
    from tokenmill.pipeline.run.staged_output import fetch_outputs, publish, publish_folder
    from tokenmill.pipeline.run.stats import STATS_NAME, stats_table

    local = Path(res.manifest_path).parent  # for an object-store output: its staging copy
    out = res.output or str(local)
    print()
    print(summary_table(res.manifest))
    if cuts := cut_lines(res.edits):
        print("\ncut from kept documents (edit records in the quarantine):")
        print("\n".join(f"  {line}" for line in cuts))
    print()
    print(stats_table(res.stats))
    print()
    if res.reused_units == res.total_units:
        print("nothing to redo: every block was already done by an earlier run")
    for p in res.recovered:
        print(f"recomputed a corrupt or incomplete intermediate: {p}")
    skipped = [f"{s.name}: {f}" for s in res.manifest.sources for f in s.skipped_files]
    if skipped:
        print(f"not read (unsupported file types): {'; '.join(skipped)}")
    print(blocks_line(res))
    size = (f"{res.input_bytes / 1e6:,.1f} MB" if res.input_bytes >= 1e6
            else f"{res.input_bytes:,} bytes")
    n_files = sum(len(s.files) for s in res.manifest.sources)
    print(f"inputs: {counted(n_files, 'file')}, {size}, "
          f"sha256 (the resume cache's key) in {res.hash_seconds:.2f} s of task time")
    if not args.no_report or args.write_text or cfg.write_text:
        fetch_outputs(out, res.manifest)  # what the report and the text read, on this node
    if not args.no_report:
        from tokenmill.pipeline.report.curation_report import write_report

        t0 = time.perf_counter()
        rep = write_report(local, res.manifest, workers=plot_workers, drawn=early)
        publish(out, [rep.html, *rep.images])
        print(f"report:   {_shown(out, local, rep.html)} ({len(rep.images)} plots, "
              f"{time.perf_counter() - t0:.1f} s)")
    if args.write_text or cfg.write_text:
        from tokenmill.pipeline.report.hub_text import write_hub_text

        txt = write_hub_text(local)
        publish_folder(out, txt.folder)
        print(f"text:     {_shown(out, local, txt.folder)} ({txt.documents} documents in "
              f"{len(txt.files)} parquet files{', unchanged' if txt.reused else ''}; "
              "datasets.load_dataset(FOLDER))")
    print(f"shards:   {storage.redact(storage.join(out, 'shards'))}")
    print(f"manifest: {_shown(out, local, Path(res.manifest_path))}")
    print(f"stats:    {_shown(out, local, local / STATS_NAME)} (time per stage)")
    if args.strict and res.warnings:
        for w in res.warnings:
            print(f"tokenmill: error: {w.message}", file=sys.stderr)
        return 2
    return 0


def _shown(out: str, local: Path, path: Path) -> str:
    """How the output names ``path`` (a file of the staging copy ``local`` of ``out``)."""
    from tokenmill import storage

    return storage.redact(storage.join(out, path.relative_to(local).as_posix()))


def blocks_line(res) -> str:
    """The CLI's ``blocks:`` line: blocks in all and reused, then per stage (in pipeline
    order) ``reused/blocks``, and the wall time."""
    per_stage = ", ".join(f"{name} {reused}/{reused + computed}"
                          for name, (reused, computed) in res.stage_blocks.items())
    return (f"blocks: {res.total_units} ({res.reused_units} reused whole from an earlier run; "
            f"reused/blocks per stage: {per_stage})   wall time: {res.seconds:.1f} s")


def _report(args: argparse.Namespace) -> int:
    from tokenmill.pipeline.report.curation_report import write_report

    res = write_report(args.output_dir)
    print(f"wrote {res.html} and {len(res.images)} plots"
          + (f"; skipped: {', '.join(sorted(res.skipped))}" if res.skipped else ""))
    return 0


def _add_report_parser(sub: argparse._SubParsersAction) -> None:
    """``tokenmill report OUTPUT_DIR`` (the report module, with every stage behind it, is
    imported when the command runs, not when the parser is built)."""
    p = sub.add_parser("report", help="write report.html + PNG plots for a run")
    p.add_argument("output_dir", help="a curation run's output folder (with manifest.json)")
    p.set_defaults(func=_report)


def add_commands(sub: argparse._SubParsersAction) -> None:
    from tokenmill.cliargs import add_output_argument, add_quiet_argument

    p = sub.add_parser("run", help="curate a datamix into token shards and a manifest")
    p.add_argument("datamix", help="the datamix (curation config) YAML to curate, e.g. "
                   "manifests/quickstart.yaml")
    p.add_argument("--data-root", default=None,
                   help="folder of local sources (default: TOKENMILL_DATA_ROOT, then the file's)")
    add_output_argument(p, help="output folder (default: the datamix's output_dir, else "
                        "out/NAME)")
    p.add_argument("--ray-address", default=os.environ.get("TOKENMILL_RAY_ADDRESS"),
                   help="join a Ray cluster (HOST:PORT, or auto: the one `ray start` made on "
                   "this machine) instead of an embedded local Ray; default: "
                   "TOKENMILL_RAY_ADDRESS, then RAY_ADDRESS (set by `ray job submit`)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the embedded Ray")
    p.add_argument("--fallback", default=None,
                   help="datamix to run instead when the local data root is missing")
    add_quiet_argument(p, help="no progress bars")
    p.add_argument("--no-report", action="store_true", help="skip report.html and its plots")
    p.add_argument("--strict", action="store_true",
                   help="warnings are errors: a file that yields no document, a source that "
                   "keeps none, a quarantined share over checks.max_quarantine_share (exit 2, "
                   "one line each, after the outputs are written)")
    p.add_argument("--write-text", action="store_true",
                   help="also write the curated text as a Hugging Face parquet dataset "
                   "(OUT/text/, loadable with datasets.load_dataset; datamix: write_text: true)")
    p.set_defaults(func=_run)

    _add_report_parser(sub)

    from tokenmill.pipeline.classifier_train import add_classifier_parser

    add_classifier_parser(sub)
