"""Curation at 1x, 4x and 16x the cc + c4 + linux corpora: wall time, documents/s, peak RSS.

Copy k of each corpus is written with per-copy perturbations (about 3% of words replaced,
deterministically from the copy index), so that fuzzy dedup has real near-duplicates to
find and exact dedup cannot remove the copies wholesale. Each size runs as its own
`tokenmill run` process with an embedded Ray on all cores; a sampler adds up the RSS of
the driver and every process below it (raylet, Ray workers) every 0.2 s.

Targets: documents/s at 16x >= 0.8 x that at 1x; peak RSS
grows sublinearly with corpus size.

    .venv/bin/python benchmarks/bench_scale.py [--sizes 1 4 16] [--work /tmp/tm-scale]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO.parent / "shared" / "data" / "corpora"


def _perturb(text: str, rng: random.Random, rate: float = 0.03) -> str:
    words = text.split(" ")
    for i in range(len(words)):
        if rng.random() < rate:
            words[i] = rng.choice(("alpha", "beta", "gamma", "delta", "omega"))
    return " ".join(words)


def build(root: Path, copies: int) -> int:
    """Write ``copies`` perturbed copies of cc, c4 and linux under ``root``; return docs."""
    if root.exists():
        shutil.rmtree(root)
    n = 0
    for name in ("cc-main-2019-sample", "c4-en-sample"):
        src = CORPORA / name
        (root / name / "data").mkdir(parents=True)
        shutil.copy(src / "README.md", root / name / "README.md")
        (data,) = sorted((src / "data").iterdir())
        rows = [json.loads(line) for line in gzip.open(data, "rt", encoding="utf-8")]
        for k in range(copies):
            rng = random.Random(f"{name}-{k}")
            out = root / name / "data" / f"copy{k:03d}.jsonl.gz"
            with gzip.open(out, "wt", encoding="utf-8") as f:
                for r in rows:
                    r2 = dict(r, text=_perturb(r["text"], rng) if k else r["text"])
                    f.write(json.dumps(r2) + "\n")
            n += len(rows)
    src = CORPORA / "linux-docs-rst"
    (root / "linux-docs-rst").mkdir(parents=True)
    shutil.copy(src / "README.md", root / "linux-docs-rst" / "README.md")
    files = sorted(src.rglob("*.rst.txt"))
    for k in range(copies):
        rng = random.Random(f"linux-{k}")
        for f in files:
            dst = root / "linux-docs-rst" / f"copy{k:03d}" / f.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = f.read_text(encoding="utf-8", errors="replace")
            dst.write_text(_perturb(text, rng) if k else text, encoding="utf-8")
        n += len(files)
    return n


DATAMIX = """name: scale
tokenizer: gpt2
licenses: {allow: [odc-by, gpl-2.0]}
sources:
  - {name: cc, path: cc-main-2019-sample, document_license: cc-attributes}
  - {name: c4, path: c4-en-sample}
  - {name: linux, path: linux-docs-rst, quality_filters: false}
quality: {gopher_quality: {}, gopher_repetition: {}, c4: {modify_text: false}, fineweb: {}}
language: {languages: [en], min_score: 0.65}
fuzzy_dedup: {threshold: 0.8, ngram: 5, num_perm: 128}
shards: {tokens_per_shard: 10000000, val_fraction: 0.01}
"""


def run(root: Path, out: Path) -> tuple[float, int, int, int]:
    """Run the datamix; return (seconds, peak total RSS, peak driver RSS, peak worker RSS)."""
    yml = root / "scale.yaml"
    yml.write_text(DATAMIX)
    cmd = [sys.executable, "-m", "tokenmill.cli", "run", str(yml), "--data-root", str(root),
           "-o", str(out), "-q", "--no-report"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    peak = [0, 0, 0]
    stop = threading.Event()

    def sample() -> None:
        proc = psutil.Process(p.pid)
        while not stop.is_set():
            try:
                kids = proc.children(recursive=True)
                d = proc.memory_info().rss
                w = [k.memory_info().rss for k in kids
                     if "ray::" in " ".join(k.cmdline()[:1]) or "default_worker" in
                     " ".join(k.cmdline())]
                tot = d + sum(k.memory_info().rss for k in kids)
                peak[0] = max(peak[0], tot)
                peak[1] = max(peak[1], d)
                peak[2] = max([peak[2], *w])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
            stop.wait(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    log = p.communicate()[0]
    stop.set()
    th.join()
    if p.returncode != 0:
        raise SystemExit(f"tokenmill run failed:\n{log[-3000:]}")
    return time.perf_counter() - t0, *peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--work", default="/tmp/tokenmill-scale")
    args = ap.parse_args()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared/data/tiktoken"))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    work = Path(args.work)
    rows = []
    for size in args.sizes:
        root = work / f"x{size}"
        docs = build(root, size)
        secs, tot, drv, wrk = run(root, work / f"out{size}")
        m = json.loads((work / f"out{size}" / "manifest.json").read_text())
        kept = sum(s["counts"]["kept"] for s in m["sources"])
        near = sum(s["counts"]["near_duplicates"] for s in m["sources"])
        rows.append((size, docs, kept, near, secs, docs / secs, tot, drv, wrk))
        shutil.rmtree(root)
        print(f"{size}x done in {secs:.1f} s", flush=True)
    print(f"\ncores: {os.cpu_count()}")
    print(f"{'size':>5} {'docs':>8} {'kept':>8} {'near dup':>8} {'wall s':>8} {'docs/s':>8} "
          f"{'peak RSS MB':>12} {'driver MB':>10} {'worker MB':>10}")
    for size, docs, kept, near, secs, dps, tot, drv, wrk in rows:
        print(f"{size:>4}x {docs:>8} {kept:>8} {near:>8} {secs:>8.1f} {dps:>8.1f} "
              f"{tot / 2**20:>12.0f} {drv / 2**20:>10.0f} {wrk / 2**20:>10.0f}")
    base = rows[0]
    for r in rows[1:]:
        print(f"{r[0]}x vs {base[0]}x: docs/s ratio {r[5] / base[5]:.2f} (target >= 0.8), "
              f"peak RSS ratio {r[6] / base[6]:.2f} for {r[1] / base[1]:.0f}x the documents")


if __name__ == "__main__":
    main()
