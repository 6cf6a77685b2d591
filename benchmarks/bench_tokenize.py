"""Tokenize-stage throughput vs bare tiktoken, on the same texts and the same cores.

Runs over ../shared/data/corpora/linux-docs-rst (3,183 .rst.txt files, ~30 MB):

* bare: ``enc.encode_ordinary_batch(texts, num_threads=W)`` on all texts;
* stage: tokenmill's tokenize stage (``tokenize_batch``: EOT-prefixed, flattened to a
  uint32 array) as the pipeline runs it, one Ray task per unit of texts on W workers.

Prints MB/s for both and the ratio (target: stage >= 0.8 x bare).

    .venv/bin/python benchmarks/bench_tokenize.py [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared/data/tiktoken"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=str(REPO.parent / "shared/data/corpora/linux-docs-rst"))
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
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

    def bare() -> int:
        return sum(len(t) for t in enc.encode_ordinary_batch(texts, num_threads=args.workers))

    ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TIKTOKEN_CACHE_DIR": os.environ["TIKTOKEN_CACHE_DIR"]}})

    @ray.remote
    def stage_task(batch: list[str]) -> int:
        tokens, _ = tokenize_batch(batch, "gpt2")
        return int(tokens.size)

    refs = [ray.put(u) for u in units]
    ray.get([stage_task.remote(r) for r in refs[: args.workers]])  # warm the workers

    def stage() -> int:
        return sum(ray.get([stage_task.remote(r) for r in refs]))

    def best(fn) -> tuple[float, int]:
        times, n = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            n = fn()
            times.append(time.perf_counter() - t0)
        return min(times), n

    tb, nb = best(bare)
    ts, ns = best(stage)
    ray.shutdown()
    assert ns == nb + len(texts), "stage must produce the bare tokens plus one EOT per document"
    print(f"corpus: {args.corpus} ({len(texts)} documents, {mb:.1f} MB), workers: {args.workers}")
    print(f"{'':36s} {'seconds':>8s} {'MB/s':>8s} {'Mtok/s':>8s}")
    for name, t, n in (("bare tiktoken encode_ordinary_batch", tb, nb),
                       ("tokenmill tokenize stage (Ray)", ts, ns)):
        print(f"{name:36s} {t:8.2f} {mb / t:8.2f} {n / t / 1e6:8.2f}")
    print(f"ratio stage/bare: {tb / ts:.2f}  (target >= 0.8)")


if __name__ == "__main__":
    main()
