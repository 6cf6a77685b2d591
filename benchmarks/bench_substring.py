"""Exact-substring dedup's search at 10 M and 100 M tokens: wall and CPU time, peak memory.

The corpus: copies of the cc and c4 samples with about 3 % of words replaced per copy
(deterministically from the copy index, as ``bench_scale.py`` makes them), so that not
every span repeats, tokenized with gpt2 until the size is reached (time not counted).
Each size runs in its own process (its peak RSS is its own), twice:

* ``tokenmill``: :func:`tokenmill.pipeline.dedup.substring_spans.repeated_token_spans`,
  the stage's steps in one process (suffix array and LCP per part, representatives
  merged across parts, windows to spans), with ``--part-tokens`` per part;
* ``hashed windows``: the peer, every ``min_tokens``-token window hashed (two 64-bit
  polynomial hashes, numpy) and its first occurrence found with ``np.unique``, the
  covered spans marked; the two must cut the same number of tokens.

    .venv/bin/python benchmarks/bench_substring.py [--sizes 10 100] [--min-tokens 50]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_scale import _perturb  # the same perturbed copies as the scale bench

REPO = Path(__file__).resolve().parents[1]
CORPORA = REPO.parent / "shared" / "data" / "corpora"
MILLION = 1_000_000


def corpus(tokens: int) -> list[np.ndarray]:
    """Perturbed copies of cc + c4, tokenized (gpt2), until ``tokens`` tokens."""
    from tokenmill.tokenizers import get_encoding

    enc = get_encoding("gpt2")
    texts = []
    for name in ("cc-main-2019-sample", "c4-en-sample"):
        (data,) = sorted((CORPORA / name / "data").iterdir())
        texts += [json.loads(line)["text"] for line in gzip.open(data, "rt", encoding="utf-8")]
    docs: list[np.ndarray] = []
    total, copy = 0, 0
    while total < tokens:
        rng = random.Random(f"copy-{copy}")
        batch = [_perturb(t, rng) if copy else t for t in texts]
        for ids in enc.encode_ordinary_batch(batch, num_threads=2):
            docs.append(np.asarray(ids, np.int32))
            total += len(ids)
            if total >= tokens:
                break
        copy += 1
    return docs


def hashed_windows(docs: list[np.ndarray], k: int) -> int:
    """The peer: tokens cut when every k-window seen before is cut (numpy hashing)."""
    text = np.concatenate(docs).astype(np.uint64)
    ends = np.cumsum([d.size for d in docs])
    starts = np.concatenate(([0], ends[:-1]))
    n = text.size
    keys = []
    for base in (np.uint64(1_000_003), np.uint64(998_244_353)):
        h = np.zeros(max(n - k + 1, 0), np.uint64)
        with np.errstate(over="ignore"):
            for j in range(k):
                h = h * base + text[j : j + h.size]
        keys.append(h)
    pos = np.arange(keys[0].size)
    doc_end = np.repeat(ends, [d.size for d in docs])[: pos.size]
    valid = pos + k <= doc_end
    pos = pos[valid]
    pair = np.stack([keys[0][valid], keys[1][valid]], axis=1)
    _, first = np.unique(pair, axis=0, return_index=True)
    later = np.ones(pos.size, bool)
    later[first] = False
    diff = np.zeros(n + 1, np.int32)
    np.add.at(diff, pos[later], 1)
    np.add.at(diff, pos[later] + k, -1)
    del starts
    return int((np.cumsum(diff[:n]) > 0).sum())


def one(size_m: int, k: int, part_tokens: int, which: str) -> dict:
    """One size and implementation, in this process."""
    from tokenmill.pipeline.dedup.substring_spans import repeated_token_spans

    docs = corpus(size_m * MILLION)
    data_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    if which == "tokenmill":
        cut = sum(int((s[:, 1] - s[:, 0]).sum()) for s in repeated_token_spans(docs, k,
                                                                              part_tokens))
    else:
        cut = hashed_windows(docs, k)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"tokens": sum(d.size for d in docs), "cut": cut, "wall": wall, "cpu": cpu,
            "peak_gib": peak / 2**20, "data_gib": data_rss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100],
                    help="millions of tokens")
    ap.add_argument("--min-tokens", type=int, default=50)
    ap.add_argument("--part-tokens", type=int, default=50 * MILLION)
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "WHICH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(int(a.one[0]), a.min_tokens, a.part_tokens, a.one[1])))
        return
    print(f"min_tokens {a.min_tokens}, part_tokens {a.part_tokens:,}")
    print(f"{'size':>6} {'impl':>15} {'tokens':>12} {'cut':>10} {'wall s':>8} {'cpu s':>8} "
          f"{'peak GiB':>9} {'data GiB':>9} {'ratio':>7}")
    for size in a.sizes:
        rows = {}
        for which in ("tokenmill", "hashed windows"):
            r = subprocess.run([sys.executable, __file__, "--one", str(size), which,
                                "--min-tokens", str(a.min_tokens),
                                "--part-tokens", str(a.part_tokens)],
                               capture_output=True, text=True, check=True)
            rows[which] = json.loads(r.stdout.strip().splitlines()[-1])
        for which, x in rows.items():
            ratio = x["cpu"] / rows["tokenmill"]["cpu"]
            print(f"{size:>5}M {which:>15} {x['tokens']:>12,} {x['cut']:>10,} {x['wall']:>8.1f} "
                  f"{x['cpu']:>8.1f} {x['peak_gib']:>9.2f} {x['data_gib']:>9.2f} {ratio:>7.2f}")
        if rows["tokenmill"]["cut"] != rows["hashed windows"]["cut"]:
            print(f"  tokens cut differ at {size}M: the peer's hashes collided or a bug")


if __name__ == "__main__":
    main()
