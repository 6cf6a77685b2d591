"""Tokenize-stage throughput vs bare tiktoken, on the same texts and the same cores.

Runs over ../shared/data/corpora/linux-docs-rst (3,183 .rst.txt files, ~30 MB):

* bare: ``enc.encode_ordinary_batch(texts, num_threads=W)`` on all texts;
* stage: tokenmill's tokenize stage (``tokenize_batch``: EOT-prefixed, flattened to a
  uint32 array) as the pipeline runs it, one Ray task per unit of texts on W workers.

The two alternate (bare, stage, stage, bare, ...), so that a change in the machine's load
falls on both; the ratio printed is the median of the ratios of each pair (and the best
times' ratio). CPU seconds are measured too (bare: this process, its threads included;
stage: inside the Ray tasks), so that MB per CPU second compares the work itself on a
shared machine. Prints MB/s for both and the ratios (target: stage >= 1.0 x bare).

    .venv/bin/python benchmarks/bench_tokenize.py [--workers 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared/data/tiktoken"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(REPO.parent / "shared/data/corpora/linux-docs-rst"))
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--unit-files", type=int, default=64)
    args = ap.parse_args()

    import ray

    from tokenmill.pipeline.read.normalize import normalize_text
    from tokenmill.pipeline.run.tokenize import tokenize_batch
    from tokenmill.tokenizers import get_encoding

    files = sorted(Path(args.corpus).rglob("*.rst.txt"))
    texts = [normalize_text(f.read_text(encoding="utf-8", errors="replace")) for f in files]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    units = [texts[i : i + args.unit_files] for i in range(0, len(texts), args.unit_files)]
    enc = get_encoding("gpt2")

    def bare() -> tuple[int, float]:
        cpu0 = time.process_time()
        n = sum(len(t) for t in enc.encode_ordinary_batch(texts, num_threads=args.workers))
        return n, time.process_time() - cpu0

    ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TIKTOKEN_CACHE_DIR": os.environ["TIKTOKEN_CACHE_DIR"]}})

    @ray.remote
    def stage_task(batch: list[str]) -> tuple[int, float]:
        cpu0 = time.process_time()
        tokens, _ = tokenize_batch(batch, "gpt2")
        return int(tokens.size), time.process_time() - cpu0

    refs = [ray.put(u) for u in units]
    ray.get([stage_task.remote(r) for r in refs[: args.workers]])  # warm the workers

    def stage() -> tuple[int, float]:
        done = ray.get([stage_task.remote(r) for r in refs])
        return sum(n for n, _ in done), sum(c for _, c in done)

    runs: dict[str, list[tuple[float, float, int]]] = {"bare": [], "stage": []}
    for r in range(args.repeat):
        for name, fn in ((("bare", bare), ("stage", stage)) if r % 2 == 0
                         else (("stage", stage), ("bare", bare))):
            t0 = time.perf_counter()
            n, cpu = fn()
            runs[name].append((time.perf_counter() - t0, cpu, n))
    ray.shutdown()
    nb, ns = runs["bare"][0][2], runs["stage"][0][2]
    assert ns == nb + len(texts), "stage must produce the bare tokens plus one EOT per document"
    print(f"corpus: {args.corpus} ({len(texts)} documents, {mb:.1f} MB), workers: "
          f"{args.workers}, {args.repeat} alternating runs each; load {os.getloadavg()[0]:.1f}")
    print(f"{'':36s} {'best s':>8s} {'MB/s':>8s} {'Mtok/s':>8s} {'CPU s':>8s} {'MB/CPU s':>9s}")
    best = {}
    for name, label in (("bare", "bare tiktoken encode_ordinary_batch"),
                        ("stage", "tokenmill tokenize stage (Ray)")):
        t, cpu, n = min(runs[name])
        cpu_med = statistics.median(c for _, c, _ in runs[name])
        best[name] = (t, cpu_med)
        print(f"{label:36s} {t:8.2f} {mb / t:8.2f} {n / t / 1e6:8.2f} {cpu_med:8.2f} "
              f"{mb / cpu_med:9.2f}")
    pairs = [b[0] / s[0] for b, s in zip(runs["bare"], runs["stage"], strict=True)]
    each = ", ".join(f"{p:.2f}" for p in pairs)
    print(f"ratio stage/bare: {statistics.median(pairs):.2f} median of {len(pairs)} pairs "
          f"({each}), best times {best['bare'][0] / best['stage'][0]:.2f}; "
          f"per CPU second {best['bare'][1] / best['stage'][1]:.2f}  (target >= 1.0)")


if __name__ == "__main__":
    main()
