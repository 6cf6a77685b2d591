"""Benchmark: the LEM precomputed ahead of time (``tokenmill.ngram.precompute_lem``).

Stream: the same ~11 M gpt2 tokens as ``benchmarks/bench_ngram.py`` (linux-docs-rst plus the
quickstart corpora from ../shared/data/corpora, EOT before every document, train split),
position mode, k = 4, the default window (4 M tokens).

Measured: one worker in this process (wall and CPU seconds: M tokens/s per core = tokens /
CPU seconds) and two workers as Ray tasks on an embedded 2-CPU Ray (started, and both
paths run once untimed over the whole stream, before the clock starts), alternating
``--reps`` times (default 5) so that a drift in a shared machine's speed hits both; the
medians are reported, and the speedup is the median over the reps of the 1-worker wall
time over the 2-worker one (each pair runs seconds apart; the ratio of the medians is
printed too). The results are checked to be identical. Both are timed with the embedded
Ray up (its idle daemons and workers share the cores with the 1-worker run too). Every
worker is one core: ``OMP_NUM_THREADS=1`` (libdivsufsort's OpenMP threads; Ray sets the
same for its 1-CPU tasks). Targets: >= 1.5 M tokens/s per core, 2 workers
>= 1.8x. On a machine shared with other jobs the wall-clock figures (and so the speedup)
are pessimistic; the load average is printed.

Usage: ``python benchmarks/bench_lem.py [--out DIR] [--tokens N] [--window W] [--k K] [--reps R]``
Last line: ``lem precompute: X.XX M tokens/s per core, 2 workers X.XXx``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# one worker is one core: libdivsufsort's OpenMP would otherwise put a second thread on the
# other core during the in-process run (Ray already gives each 1-CPU task one OpenMP thread)
os.environ["OMP_NUM_THREADS"] = "1"

from tests.ngram.datamix import write_datamix  # noqa: E402
from tokenmill.manifests.schema import load_manifest  # noqa: E402
from tokenmill.manifests.shards import read_tokens  # noqa: E402
from tokenmill.ngram.precompute import precompute_lem  # noqa: E402
from tokenmill.raysession import ray_session  # noqa: E402

SOURCES = ["linux-docs-rst", "c4-en-sample", "cc-main-2019-sample",
           "wikipedia-wikitext-sample", "books-public-domain"]
EOT = 50256


def load_stream(out: Path) -> np.ndarray:
    """The benchmark stream (tokenized once into ``out/data``, as bench_ngram does)."""
    data = out / "data"
    if not (data / "manifest.json").exists():
        t = time.perf_counter()
        write_datamix(SHARED / "corpora", data, SOURCES, max_shard_tokens=4_000_000)
        print(f"tokenized the corpora in {time.perf_counter() - t:.1f} s")
    shards = load_manifest(data / "manifest.json").shards("train")
    return np.concatenate([np.asarray(read_tokens(data / s.path), dtype=np.int32)
                           for s in shards])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/tokenmill_bench_ngram")
    ap.add_argument("--tokens", type=int, default=0, help="0: the whole stream")
    ap.add_argument("--window", type=int, default=4_000_000)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5, help="alternating 1- and 2-worker runs")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    x = load_stream(Path(args.out))
    if args.tokens:
        x = x[:args.tokens]
    n = x.size
    kw = {"k": args.k, "mode": "position", "window": args.window, "eot": EOT}
    print(f"tokens: {n:,}, window {args.window:,}, k {args.k}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    precompute_lem(x[:20_000], **{**kw, "window": 8192})  # compile / load numba caches

    with ray_session(None, 2):
        # warm up before the clock: both Ray workers (process start, imports, numba
        # caches) and both paths at full size (a fresh worker's first full-size chunks
        # ran 20-40 % slower: its allocator and page tables grow), as a long-running
        # cluster's workers are
        precompute_lem(x[:40_000], **{**kw, "window": 8192}, workers=2)
        precompute_lem(x, **kw, workers=2)
        precompute_lem(x, **kw)
        # 1 and 2 workers alternate, so that a drift in the machine's speed (a shared
        # host) hits both alike; the medians are reported
        one_wall, one_cpu, two_wall, same = [], [], [], True
        for rep in range(args.reps):
            w0, c0 = time.perf_counter(), time.process_time()
            one = precompute_lem(x, **kw)
            one_wall.append(time.perf_counter() - w0)
            one_cpu.append(time.process_time() - c0)
            w0 = time.perf_counter()
            two = precompute_lem(x, **kw, workers=2)
            two_wall.append(time.perf_counter() - w0)
            same = same and np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
            print(f"rep {rep + 1}: 1 worker {one_wall[-1]:.2f} s wall, {one_cpu[-1]:.2f} s "
                  f"CPU; 2 workers {two_wall[-1]:.2f} s wall; load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    wall1, cpu1, wall2 = (float(np.median(v)) for v in (one_wall, one_cpu, two_wall))
    # each rep's two runs are seconds apart: their ratio cancels the host's slow drift
    speedup = float(np.median(np.asarray(one_wall) / np.asarray(two_wall)))
    print(f"1 worker : {wall1:7.2f} s wall, {cpu1:7.2f} s CPU, "
          f"{n / wall1 / 1e6:.2f} M tokens/s wall, {n / cpu1 / 1e6:.2f} M tokens/s per core "
          f"(medians of {args.reps})")
    print(f"2 workers: {wall2:7.2f} s wall (Ray tasks), {n / wall2 / 1e6:.2f} M tokens/s; "
          f"identical to 1 worker: {same}; speedup: median of the reps' ratios "
          f"{speedup:.2f}x, ratio of the medians {wall1 / wall2:.2f}x")
    ml = one[0]
    print(f"match length > 0 at {(ml > 0).mean():.1%} of positions, mean {ml.mean():.2f}; "
          f"side channel: {1 + 2 * args.k} bytes/token (uint8 length, uint16 candidates)")
    print(f"lem precompute: {n / cpu1 / 1e6:.2f} M tokens/s per core, 2 workers "
          f"{speedup:.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
