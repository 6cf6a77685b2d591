"""CPU ablation of the trainer's side inputs: does each one help, beyond seed noise?

Design:

* data: a training mix built here from a curation output (``tokenmill mix build``; the
  weights of ``manifests/mix-example.yaml``, ``max_epochs: 1``, sized to the run), read by
  the trainer's own loader: one pass, no replacement, document-aligned rows. Every run reads
  the same rows in the same order; the seed changes only the model's initialisation.
* arms, each trained for the same steps with ``--seeds`` seeds, paired by seed with the
  baseline: ``noise`` (a second baseline with seeds 100, 101, ...: the noise floor),
  ``prefix-anneal`` (prefix auxiliary loss, weight 0.25 falling linearly to 0: the
  speedrun's schedule), ``prefix-const`` (weight 0.25 throughout; not in the default set),
  ``lem`` (precomputed LEM side channel, ``tokenmill ngram lem``), ``lem-placebo`` (the
  same side channel with the candidate rows shuffled across positions of the same
  match-length bucket, in training and validation alike), ``ngram`` (``tokenmill ngram
  features``; reported as unavailable when this checkout lacks it) and ``all``.
* output: per arm, the mean paired difference of the final validation loss against the
  baseline with a 95 % t-interval over the seeds, at equal steps and at equal wall-clock
  (each run's validation loss is interpolated linearly in training seconds between
  evaluations in the last ``1 - --eval-from`` of the run, at the shorter of the two paired
  runs' training times; evaluation and setup time are not training time). An interval
  that contains 0 reads "no measurable effect", one above 0 "hurts", one below 0 "helps".
  The legality mask is reported apart: the baseline's final validation loss renormalised
  over the tokens that can follow the previous token (a property of the tokenizer, not
  something training learned).

Runs go ``--jobs`` at a time, one torch thread each, in separate processes. The table is
printed in Markdown and written to ``--report`` with the command line on top.

Usage::

    python benchmarks/ablation_cpu.py                       # the full design (~30 min idle)
    python benchmarks/ablation_cpu.py --smoke               # 2 seeds x 8 steps: a check
    python benchmarks/ablation_cpu.py --arms lem,lem-placebo --seeds 8 --steps 300
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import math
import multiprocessing as mp
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "data" / "tiktoken"))

from tokenmill.atomic import atomic_write_text, sha256_file  # noqa: E402
from tokenmill.manifests.mixschema import TrainingMixManifest  # noqa: E402
from tokenmill.manifests.verify import read_manifest  # noqa: E402
from tokenmill.train import train as T  # noqa: E402
from tokenmill.train.batches import open_data  # noqa: E402
from tokenmill.train.model import DEFAULT_LEM_BUCKETS  # noqa: E402
from tokenmill.train.targets import save_rows_table  # noqa: E402

PREFIX_WEIGHT = 0.25  # the speedrun's start weight
NOISE_SEED0 = 100  # the noise floor's second baseline uses seeds 100, 101, ...
ARMS = ("baseline", "noise", "prefix-anneal", "prefix-const", "lem", "lem-placebo", "ngram",
        "all")
DEFAULT_ARMS = "noise,prefix-anneal,lem,lem-placebo,ngram,all"
# mix-example.yaml's weights, one pass over each source (max_epochs 1)
MIX_WEIGHTS = {"web": ("cc-main-2019-sample", 0.35), "c4": ("c4-en-sample", 0.25),
               "code-docs": ("python-docs-rst", 0.2),
               "wiki": ("wikipedia-wikitext-sample", 0.1),
               "books": ("books-public-domain", 0.1)}
# two-sided 95 % Student t quantiles by degrees of freedom (1.96 past 30)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


# ----------------------------------------------------------------------------------------------
# data and side channels
# ----------------------------------------------------------------------------------------------


def tokenmill_cli(*args: str, log: Path) -> subprocess.CompletedProcess:
    """Run ``python -m tokenmill.cli ARGS`` (output appended to ``log``)."""
    with open(log, "a") as fh:
        fh.write(f"$ tokenmill {' '.join(args)}\n")
        fh.flush()
        return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], cwd=REPO,
                              stdout=fh, stderr=subprocess.STDOUT, check=False)


def build_mix(data: str, tokens: int, out: Path, log: Path) -> Path:
    """A training mix of about ``tokens`` train tokens over the curation output ``data``
    (mix-example.yaml's weights, ``max_epochs: 1``, shortfalls redistributed), or ``data``
    itself when it is already a training-mix manifest.

    Raises:
        RuntimeError: ``tokenmill mix build`` failed (see ``log``).
    """
    if isinstance(read_manifest(data, None)[1], TrainingMixManifest):
        return Path(data)
    manifest = Path(data) / "manifest.json" if Path(data).is_dir() else Path(data)
    spec = {"name": "ablation-mix", "manifests": [str(manifest.resolve())],
            "target_tokens": int(tokens), "seed": 1234, "on_shortfall": "redistribute",
            "sources": {k: {"source": s, "weight": w, "max_epochs": 1}
                        for k, (s, w) in MIX_WEIGHTS.items()}}
    atomic_write_text(out / "mix-spec.yaml", yaml.safe_dump(spec, sort_keys=False))
    mix = out / "mix" / "mix.json"
    mix.parent.mkdir(parents=True, exist_ok=True)
    if tokenmill_cli("mix", "build", str(out / "mix-spec.yaml"), "-o", str(mix),
                     log=log).returncode:
        raise RuntimeError(f"tokenmill mix build failed; see {log}")
    return mix


def bucket_of(lengths: np.ndarray, buckets: tuple[int, ...] = DEFAULT_LEM_BUCKETS,
              cap: int | None = None) -> np.ndarray:
    """The model's match-length bucket (``-1``: no match) of ``lengths`` (any int array);
    ``cap``: a saturated stored length (uint8's 255) is read as ``cap + 1``, as the trainer
    reads it."""
    x = lengths.astype(np.int64)
    if cap is not None:
        x = np.where(x == cap, cap + 1, x)
    return np.searchsorted(np.asarray(buckets), x, side="right") - 1


def shuffle_within_buckets(cand: np.ndarray, bucket: np.ndarray, seed: int) -> np.ndarray:
    """``cand [n, k]`` with its rows permuted among the positions of the same ``bucket
    [n]``: each position keeps its match-length bucket but gets the candidates of a random
    other position of that bucket (the LEM placebo)."""
    rng = np.random.default_rng(seed)
    out = np.array(cand)
    for b in np.unique(bucket):
        idx = np.flatnonzero(bucket == b)
        out[idx] = cand[rng.permutation(idx)]
    return out


def make_lem_placebo(src: Path, dst: Path, seed: int = 0) -> Path:
    """Copy the LEM side channel ``src`` to ``dst`` with every file's candidate rows
    shuffled within match-length buckets (:func:`shuffle_within_buckets`) and ``lem.json``'s
    sha256 of each rewritten file updated, so the trainer's checks accept it."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    meta = json.loads((src / "lem.json").read_text())
    for i, e in enumerate(meta["files"]):
        lens = np.load(src / e["len"])
        cap = int(np.iinfo(lens.dtype).max)
        nxt = shuffle_within_buckets(np.load(src / e["next"]), bucket_of(lens, cap=cap), seed + i)
        shutil.copyfile(src / e["len"], dst / e["len"])
        np.save(dst / e["next"], nxt)
        e["next_sha256"] = sha256_file(dst / e["next"])
    meta["placebo"] = "next-token candidates shuffled across positions within length buckets"
    atomic_write_text(dst / "lem.json", json.dumps(meta, indent=1) + "\n")
    return dst


def ngram_available() -> str | None:
    """``None`` when this checkout has the n-gram side input (``tokenmill ngram features``
    and the trainer's ``ngram_features``), else why not."""
    if "ngram_features" not in T.TrainConfig.model_fields:
        return "the trainer has no ngram_features option"
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "ngram", "features", "--help"],
                       cwd=REPO, capture_output=True, check=False)
    return None if r.returncode == 0 else "no `tokenmill ngram features` command"


def side_channels(args: argparse.Namespace, mix: Path, out: Path, arms: list[str],
                  log: Path) -> dict[str, str | None]:
    """Make the side channels the arms need: ``{"lem": dir, "lem-placebo": dir, "ngram":
    dir}``; a failed or unavailable one maps to ``None`` and its reason is printed."""
    need = set(arms)
    rows = str(args.batch_size)
    made: dict[str, str | None] = {}
    if need & {"lem", "lem-placebo", "all"}:
        window = 2 * tokens_needed(args)  # validation history = the whole trained stream
        r = tokenmill_cli("ngram", "lem", str(mix), "-o", str(out / "lem"), "--seq-len",
                          str(args.seq_len), "--batch-size", rows, "--window", str(window),
                          log=log)
        made["lem"] = None if r.returncode else str(out / "lem")
        if made["lem"] is None:
            print(f"LEM side channel failed (see {log}): lem arms unavailable")
        elif "lem-placebo" in need:
            made["lem-placebo"] = str(make_lem_placebo(out / "lem", out / "lem-placebo"))
    if need & {"ngram", "all"}:
        why = ngram_available()
        if why is None:
            chunk = max(1024, tokens_needed(args) // 16)  # counts of earlier chunks only
            r = tokenmill_cli("ngram", "features", str(mix), "-o", str(out / "ngram"),
                              "--seq-len", str(args.seq_len), "--batch-size", rows,
                              "--chunk-tokens", str(chunk), log=log)
            why = f"`tokenmill ngram features` failed (see {log})" if r.returncode else None
        made["ngram"] = None if why else str(out / "ngram")
        if why:
            print(f"n-gram arm unavailable: {why}")
    return made


def tokens_needed(args: argparse.Namespace) -> int:
    """Train tokens the run reads: steps x rows x (seq_len + 1)."""
    return args.steps * args.batch_size * (args.seq_len + 1)


def partial_legality(cfg: T.TrainConfig, out: Path) -> Path:
    """Packed legality rows for the validation rows' previous tokens (other rows allow
    everything and are never looked up): quick to build, exact for masked validation."""
    data = open_data(cfg)
    ident = data.tokenizer
    prev = np.unique(data.validation_rows(cfg.val_tokens)[:, :-1].numpy())
    return save_rows_table(ident.name, prev, out / f"{ident.name}_val_rows.legality")


# ----------------------------------------------------------------------------------------------
# one run (in its own process)
# ----------------------------------------------------------------------------------------------


def arm_overrides(arm: str, side: dict[str, str | None]) -> dict[str, Any] | None:
    """TrainConfig fields of ``arm`` on top of the baseline's; ``None``: unavailable."""
    prefix = {"prefix_aux_weight": PREFIX_WEIGHT, "prefix_aux_schedule": "anneal"}
    if arm in ("baseline", "noise"):
        return {}
    if arm == "prefix-anneal":
        return prefix
    if arm == "prefix-const":
        return {"prefix_aux_weight": PREFIX_WEIGHT, "prefix_aux_schedule": "constant"}
    if arm in ("lem", "lem-placebo"):
        return None if side.get(arm) is None else {"lem": True, "lem_features": side[arm]}
    if arm == "ngram":
        return None if side.get("ngram") is None else {"ngram_features": side["ngram"]}
    if arm == "all":  # whatever of the side inputs exists
        kw = dict(prefix)
        if side.get("lem"):
            kw.update(lem=True, lem_features=side["lem"])
        if side.get("ngram"):
            kw.update(ngram_features=side["ngram"])
        return kw
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")


def instrument(run: T.Run, eval_from: int, legality_final: bool) -> dict[str, Any]:
    """Wrap ``run.evaluate`` so that it (a) evaluates only from step ``eval_from`` on and at
    the end (earlier calls return NaN at no cost), (b) uses the legality mask only at the
    final step, and (c) records, per evaluation, the training seconds (wall and process
    CPU) spent since the loop's first call, evaluation time excluded."""
    rec: dict[str, Any] = {"points": [], "t0": None, "c0": None, "eval_s": 0.0,
                           "eval_cpu": 0.0}
    tables, unmasked = run.tables, replace(run.tables, mask_bits=None)
    run.tables = unmasked

    def evaluate() -> dict[str, float]:
        t, c = time.perf_counter(), time.process_time()
        if rec["t0"] is None:
            rec["t0"], rec["c0"] = t, c
        final = run.step >= run.cfg.steps
        if run.step < eval_from and not final:
            return {"val_loss": math.nan}
        run.tables = tables if (final and legality_final) else unmasked
        out = T.Run.evaluate(run)
        run.tables = unmasked
        rec["points"].append({"step": run.step, "wall": t - rec["t0"] - rec["eval_s"],
                              "cpu": c - rec["c0"] - rec["eval_cpu"], **out})
        rec["eval_s"] += time.perf_counter() - t
        rec["eval_cpu"] += time.process_time() - c
        return out

    run.evaluate = evaluate  # type: ignore[method-assign]
    return rec


def placebo_val(run: T.Run, seed: int) -> None:
    """Shuffle the validation rows' LEM candidates within length buckets, as the placebo
    side channel's (the trainer computes real ones at setup)."""
    ml, cand = run.val_side["lem_len"], run.val_side["lem_cand"]
    k = cand.shape[-1]
    shuffled = shuffle_within_buckets(cand.reshape(-1, k), bucket_of(ml.reshape(-1)), seed)
    run.val_side["lem_cand"] = shuffled.reshape(cand.shape)


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (arm, seed) and return its validation points and timings (see
    :func:`instrument`); stdout goes to ``out_dir/train.log``, checkpoints are deleted."""
    cfg = T.TrainConfig(**job["cfg"])
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "w") as log, contextlib.redirect_stdout(log):
        t0 = time.perf_counter()
        run = T.setup(cfg)
        try:
            setup_s = time.perf_counter() - t0
            if job["placebo"]:
                placebo_val(run, seed=12345)
            rec = instrument(run, job["eval_from"], job["legality_final"])
            result = T.training_loop(run)
        finally:
            run.close()
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    pts = rec["points"]
    return {"arm": job["arm"], "seed": cfg.seed, "points": pts, "final": pts[-1],
            "train_wall": pts[-1]["wall"], "train_cpu": pts[-1]["cpu"], "setup_s": setup_s,
            "tokens_per_s": result.tokens_per_s}


def run_all(jobs: list[dict[str, Any]], n_proc: int, out: Path) -> list[dict[str, Any]]:
    """Run ``jobs`` ``n_proc`` at a time, each in a fresh spawned process; results are also
    appended to ``out/runs.jsonl`` as they finish."""
    results = []
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(n_proc, mp_context=ctx, max_tasks_per_child=1) as pool:
        futs = {pool.submit(run_one, j): j for j in jobs}
        for f in cf.as_completed(futs):
            j = futs[f]
            try:
                r = f.result()
            except Exception as e:  # one failed run is reported, the others go on
                print(f"  FAILED {j['arm']} seed {j['cfg']['seed']}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''} (log: "
                      f"{j['cfg']['out_dir']}/train.log)", flush=True)
                continue
            results.append(r)
            with open(out / "runs.jsonl", "a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(f"  {len(results):>3}/{len(jobs)} {r['arm']:<14} seed {r['seed']:>3}: val "
                  f"{r['final']['val_loss']:.4f}  train {r['train_wall']:.0f} s wall "
                  f"({r['train_cpu']:.0f} s CPU), setup {r['setup_s']:.0f} s  "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
    return results


# ----------------------------------------------------------------------------------------------
# statistics and the report
# ----------------------------------------------------------------------------------------------


def t_interval(d: np.ndarray) -> tuple[float, float]:
    """Mean of the paired differences ``d`` and the half-width of its two-sided 95 %
    Student t-interval (NaN for fewer than 2 values)."""
    n = len(d)
    if n < 2:
        return (float(d.mean()) if n else math.nan), math.nan
    df = n - 1
    q = T975.get(df) or next((T975[k] for k in sorted(T975) if k >= df), 1.96)
    return float(d.mean()), q * float(d.std(ddof=1)) / math.sqrt(n)


def verdict(mean: float, half: float) -> str:
    """"helps" / "hurts" when the interval excludes 0, else "no measurable effect"."""
    if math.isnan(half):
        return "n/a (needs 2+ seeds)"
    if mean + half < 0:
        return "helps"
    if mean - half > 0:
        return "hurts"
    return "no measurable effect"


def val_at(points: list[dict[str, float]], t: float, clock: str) -> float:
    """Validation loss at training time ``t`` (seconds of ``clock``: ``wall`` or ``cpu``),
    linear between the evaluations around it; NaN before the first one."""
    pts = [(p[clock], p["val_loss"]) for p in points if not math.isnan(p["val_loss"])]
    if not pts or t < pts[0][0] - 1e-9:
        return math.nan
    for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return pts[-1][1]


def paired(base: dict[int, dict], arm: dict[int, dict], pairs: list[tuple[int, int]],
           clock: str) -> tuple[np.ndarray, np.ndarray]:
    """Per pair (baseline seed, arm seed) present in both: the final validation loss
    difference (arm - baseline) at equal steps, and at equal training time (both runs'
    losses interpolated at the shorter of their two training times)."""
    steps, wall = [], []
    for sb, sa in pairs:
        if sb not in base or sa not in arm:
            continue
        b, a = base[sb], arm[sa]
        steps.append(a["final"]["val_loss"] - b["final"]["val_loss"])
        t = min(a["final"][clock], b["final"][clock])
        wall.append(val_at(a["points"], t, clock) - val_at(b["points"], t, clock))
    return np.array(steps), np.array(wall)


def fmt_ci(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:+.4f} ± {half:.4f}" if not math.isnan(half) else f"{mean:+.4f}"


def report_table(res: dict[str, dict[int, dict]], arms: list[str], seeds: list[int],
                 unavailable: dict[str, str], clock: str) -> list[str]:
    """The Markdown rows: the noise floor, then each arm against the baseline."""
    base = res.get("baseline", {})
    lines = [f"| arm | pairs | Δ val loss, equal steps (95 % CI) | verdict | Δ val loss, equal "
             f"{clock} time (95 % CI) | verdict | train time / baseline | mean val loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    bt = np.mean([r["final"][clock] for r in base.values()]) if base else math.nan
    bv = np.mean([r["final"]["val_loss"] for r in base.values()]) if base else math.nan
    lines.append(f"| baseline | {len(base)} | – | – | – | – | 1.00 | {bv:.4f} |")
    for arm in arms:
        if arm in unavailable:
            lines.append(f"| {arm} | 0 | unavailable: {unavailable[arm]} | | | | | |")
            continue
        runs = res.get(arm, {})
        pairs = [(s, s + NOISE_SEED0 if arm == "noise" else s) for s in seeds]
        d_steps, d_wall = paired(base, runs, pairs, clock)
        ms, hs = t_interval(d_steps)
        ok = d_wall[~np.isnan(d_wall)]
        mw, hw = t_interval(ok)
        ratio = np.mean([r["final"][clock] for r in runs.values()]) / bt if runs else math.nan
        av = np.mean([r["final"]["val_loss"] for r in runs.values()]) if runs else math.nan
        name = "noise floor (baseline, other seeds)" if arm == "noise" else arm
        wall_pairs = f" ({len(ok)} pairs)" if len(ok) != len(d_steps) else ""
        lines.append(f"| {name} | {len(d_steps)} | {fmt_ci(ms, hs)} | {verdict(ms, hs)} | "
                     f"{fmt_ci(mw, hw)}{wall_pairs} | {verdict(mw, hw)} | {ratio:.2f} | "
                     f"{av:.4f} |")
    return lines


def mask_lines(base: dict[int, dict]) -> list[str]:
    """The legality mask at evaluation: the baseline's masked minus unmasked final loss."""
    fin = [r["final"] for r in base.values() if "val_loss_masked" in r["final"]]
    if not fin:
        return ["Legality mask: not evaluated."]
    d = np.array([f["val_loss_masked"] - f["val_loss"] for f in fin])
    m, h = t_interval(d)
    bad = int(sum(f.get("masked_targets", 0) for f in fin))
    return [f"Renormalisation over possible tokens (legality mask at evaluation, baseline "
            f"runs; not a training effect): masked − unmasked final val loss "
            f"{fmt_ci(m, h)} nats/token over {len(fin)} seeds; validation targets the "
            f"table marks impossible: {bad} (must be 0)."]


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / "out" / "quickstart"),
                    help="curation output (a mix is built from it) or a training-mix manifest "
                    "(default: out/quickstart, what `make run` writes)")
    ap.add_argument("--arms", default=DEFAULT_ARMS,
                    help=f"comma list from {', '.join(ARMS[1:])} (the baseline always runs; "
                    f"default {DEFAULT_ARMS})")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per arm (0, 1, ...)")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--val-tokens", type=int, default=4096)
    ap.add_argument("--eval-from", type=float, default=0.3,
                    help="evaluate every steps/8 from this fraction of the run on (and at "
                    "the end): the points equal wall-clock interpolates between")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="training time for the equal-time comparison: wall seconds, or the "
                    "run's process CPU seconds (steadier on a shared machine)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (1 torch thread each)")
    ap.add_argument("--out", default=str(REPO / "out" / "ablation"))
    ap.add_argument("--report", default=str(REPO / "out" / "ablation.md"))
    ap.add_argument("--smoke", action="store_true",
                    help="a check of the script: 2 seeds, 8 steps, 1024 val tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seeds, args.steps, args.val_tokens, args.eval_from = 2, 8, 1024, 0.5
    args.arm_list = [a.strip() for a in args.arms.split(",") if a.strip() not in ("", "baseline")]
    bad = [a for a in args.arm_list if a not in ARMS]
    if bad:
        ap.error(f"unknown arm(s) {', '.join(bad)}; choose from {', '.join(ARMS[1:])}")
    return args


def make_jobs(args: argparse.Namespace, mix: Path, out: Path, side: dict[str, str | None],
              legality: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One job per (arm, seed), ordered seed by seed so that paired runs run close in time;
    and the arms that cannot run, with why."""
    common = dict(data=str(mix), model=args.model, seq_len=args.seq_len,
                  batch_size=args.batch_size, steps=args.steps, lr=args.lr, warmup_steps=10,
                  val_every=max(1, args.steps // 8), val_tokens=args.val_tokens,
                  num_threads=1, progress=False, device="cpu", keep_checkpoints=1)
    unavailable = {}
    jobs = []
    for i in range(args.seeds):
        for arm in ["baseline", *args.arm_list]:
            kw = arm_overrides(arm, side)
            if kw is None:
                unavailable[arm] = ("side channel not made (see the log)" if arm != "ngram"
                                    else ngram_available() or "side channel not made")
                continue
            seed = i + NOISE_SEED0 if arm == "noise" else i
            cfg = {**common, **kw, "seed": seed, "out_dir": str(out / "runs" / f"{arm}-s{seed}")}
            if arm == "baseline":
                cfg["legality"] = str(legality)
            jobs.append({"arm": arm, "cfg": cfg, "placebo": arm == "lem-placebo",
                         "eval_from": int(args.eval_from * args.steps),
                         "legality_final": arm == "baseline"})
    return jobs, unavailable


def check_data(args: argparse.Namespace, mix: Path) -> None:
    """Refuse a mix that gives fewer than ``--steps`` steps in one pass."""
    cfg = T.TrainConfig(data=str(mix), seq_len=args.seq_len, batch_size=args.batch_size,
                        steps=args.steps, device="cpu")
    open_data(cfg).train_loader(cfg.steps * cfg.grad_accum)


def write_report(args: argparse.Namespace, mix: Path, results: list[dict[str, Any]],
                 unavailable: dict[str, str], side: dict[str, str | None],
                 wall_s: float) -> str:
    """The Markdown report (command line, settings, table, mask line), printed and written
    to ``--report``."""
    res: dict[str, dict[int, dict]] = {}
    for r in results:
        res.setdefault(r["arm"], {})[r["seed"]] = r
    seeds = list(range(args.seeds))
    cmd = shlex.join(["python", *sys.argv])
    tok = tokens_needed(args)
    parts = ["prefix-anneal", *(n for n in ("lem", "ngram") if side.get(n))]
    md = [f"`{cmd}`", "",
          f"{args.model} GPT, {args.steps} steps × {args.batch_size} × {args.seq_len} tokens "
          f"({tok:,} train tokens, one pass over `{mix}`, sha256 {sha256_file(mix)[:12]}), "
          f"{args.seeds} seeds per arm paired by seed (same data order; the seed sets the "
          f"initialisation), {args.val_tokens} validation tokens, {args.jobs} runs at a time "
          f"with 1 thread; {wall_s / 60:.1f} min in all.", "",
          *report_table(res, args.arm_list, seeds, unavailable, args.clock), "",
          f"Δ = arm − baseline final validation loss (nats/token), mean over seeds ± the "
          f"95 % t-interval half-width. Equal {args.clock} time: each run's validation loss "
          f"interpolated linearly in training seconds (setup and evaluation excluded) between "
          f"the evaluations after step {int(args.eval_from * args.steps)}, at the shorter of "
          f"the two paired runs' training times. The noise floor row is the baseline against "
          f"a second baseline with seeds {NOISE_SEED0}, {NOISE_SEED0 + 1}, ...: what a "
          f"difference looks like when there is no effect. `all` = {' + '.join(parts)}; "
          f"`lem-placebo` = the LEM side channel with candidate rows shuffled across "
          f"positions of the same match-length bucket (training and validation). Validation "
          f"rows: the trainer's, the first {args.val_tokens} tokens of the mix's val split.",
          "",
          *mask_lines(res.get("baseline", {}))]
    text = "\n".join(md) + "\n"
    print("\n" + text)
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.report), text)
    print(f"written to {args.report}")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")  # a rerun starts clean (side channels are remade too)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.jsonl").unlink(missing_ok=True)
    log = out / "prepare.log"
    log.write_text("")
    t0 = time.perf_counter()
    mix = build_mix(args.data, int(tokens_needed(args) * 1.15) + 8192, out, log)
    check_data(args, mix)
    side = side_channels(args, mix, out, args.arm_list, log)
    probe = T.TrainConfig(data=str(mix), seq_len=args.seq_len, val_tokens=args.val_tokens,
                          device="cpu")
    legality = partial_legality(probe, out)
    jobs, unavailable = make_jobs(args, mix, out, side, legality)
    for arm, why in unavailable.items():
        print(f"arm {arm}: unavailable ({why})")
    print(f"prepared in {time.perf_counter() - t0:.0f} s; {len(jobs)} runs, {args.jobs} at a "
          f"time", flush=True)
    results = run_all(jobs, args.jobs, out)
    write_report(args, mix, results, unavailable, side, time.perf_counter() - t0)
    return 0 if len(results) == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
