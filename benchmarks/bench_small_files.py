"""Many small files against one file: the same documents read by ``tokenmill run``.

Input: ``--docs`` synthetic English documents (deterministic, about 100 words each),
written once as one JSON Lines file and once as ``--files`` JSON Lines files of equal
share. Each layout is curated by ``tokenmill run DATAMIX -o OUT --num-cpus CORES -q
--no-report`` in a fresh process and a fresh output folder (quality filters off, so the
time is reading, normalizing, dedup, tokenizing and writing). Prints the wall time of each
and, last, exactly: ``small files vs one file: X.XXx`` (wall time ratio; the target is at
most 1.5x). Ray's start is in both times.

    .venv/bin/python benchmarks/bench_small_files.py [--docs 100000] [--files 2000]
        [--cores 2] [--work /tmp/tokenmill-bench-small-files]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

WORDS = ("the data pipeline reads every file and writes shards of tokens for a model that "
         "learns from text while the trainer checks each batch and saves its state to disk "
         "river stone paper window garden music number letter season market island bridge "
         "candle mirror forest engine planet signal harbor lantern").split()


def _documents(n: int) -> list[str]:
    r = random.Random(0)
    return [json.dumps({"text": " ".join(r.choice(WORDS) for _ in range(100)) + f" {i}."})
            for i in range(n)]


def _write(folder: Path, docs: list[str], files: int) -> None:
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n")
    per = -(-len(docs) // files)
    for k in range(files):
        part = docs[k * per:(k + 1) * per]
        (folder / f"part-{k:05d}.jsonl").write_text("\n".join(part) + "\n")


def _datamix(work: Path, name: str) -> Path:
    p = work / f"{name}.yaml"
    p.write_text(f"name: {name}\ntokenizer: gpt2\ndata_root: .\nlicenses: {{allow: [mit]}}\n"
                 f"sources:\n  - {{name: s, path: {name}, quality_filters: false}}\n"
                 "shards: {tokens_per_shard: 10000000, val_fraction: 0.0}\n")
    return p


def _run(datamix: Path, out: Path, cores: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DATA_ROOT"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tokenmill.cli", "run", str(datamix), "-o", str(out),
                    "--num-cpus", str(cores), "-q", "--no-report"], check=True, env=env,
                   stdout=subprocess.DEVNULL, cwd=datamix.parent)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--work", default="/tmp/tokenmill-bench-small-files")
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    docs = _documents(args.docs)
    _write(work / "one", docs, 1)
    _write(work / "many", docs, args.files)
    one = _run(_datamix(work, "one"), work / "out-one", args.cores)
    many = _run(_datamix(work, "many"), work / "out-many", args.cores)
    print(f"one file:          {args.docs:,} documents in {one:.1f} s")
    print(f"{args.files:,} small files: {args.docs:,} documents in {many:.1f} s")
    print(f"small files vs one file: {many / one:.2f}x")


if __name__ == "__main__":
    main()
