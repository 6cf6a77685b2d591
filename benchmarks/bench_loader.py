"""Loader throughput: tokenmill.train.data.MixLoader vs a bare np.memmap slice-and-copy.

Batches of 8 x 64 x 1024 tokens (8 ranks x 64 rows x 1024 tokens: 524,288 tokens per
global step, modded-nanogpt's batch) from the quickstart datamix, on one core. The
loader builds the whole global step in one process (world_size=1, 512 rows); a second
row times one rank of eight (64 rows per step, the plan of the full step is still
computed). The peer is the physical limit: a bare ``np.memmap`` slice of the same
number of tokens (+1) copied into int64 inputs and targets, as modded-nanogpt's own
loader does per step. Target: ratio >= 0.5 and >= 50 M tokens/s.

    .venv/bin/python benchmarks/bench_loader.py [--curation out/quickstart/manifest.json]
        [--steps 200] [--dtype int64]

Without the quickstart output (``make run``) it falls back to a small datamix built
from ../shared/data/corpora in a temporary folder and says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenmill.manifests.mix import build_mix  # noqa: E402
from tokenmill.manifests.shards import read_tokens  # noqa: E402
from tokenmill.manifests.verify import open_shards  # noqa: E402
from tokenmill.train.data import MixLoader  # noqa: E402

RANKS, ROWS, SEQ = 8, 64, 1024


def _curation(path: Path, tmp: Path) -> tuple[Path, str]:
    if path.exists():
        return path, str(path)
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared/data/tiktoken"))
    from tests.manifests.mixdata import write_curation

    corpora = REPO.parent / "shared/data/corpora"
    p = write_curation(corpora, tmp / "cur", "bench",
                       {"c4-en-sample": None, "wikipedia-wikitext-sample": None,
                        "python-docs-rst": 200}, max_shard_tokens=1_000_000)
    return p, f"{path} missing: fallback datamix from {corpora}"


def _bare(mm_list: list[np.ndarray], n: int, steps: int, dtype, hot: bool = False) -> float:
    """Seconds for `steps` slices of n+1 tokens copied into int inputs/targets.

    Default: walk all train shards in order (the same data the loader reads, sequential
    instead of mixed; a slice crossing a shard end is taken in two parts). ``hot``: the
    same n+1 tokens of the largest shard every step (cache-hot upper bound).
    """
    if hot:
        big = max(mm_list, key=len)
        t0 = time.perf_counter()
        for _ in range(steps):
            buf = big[: n + 1]
            x = buf[:-1].astype(dtype)
            y = buf[1:].astype(dtype)
        return time.perf_counter() - t0
    shard, pos = 0, 0
    t0 = time.perf_counter()
    for _ in range(steps):
        parts, need = [], n + 1
        while need:
            mm = mm_list[shard]
            take = min(need, len(mm) - pos)
            parts.append(mm[pos:pos + take])
            need -= take
            pos += take
            if pos == len(mm):
                shard, pos = (shard + 1) % len(mm_list), 0
        if len(parts) == 1:
            buf = parts[0]
            x = buf[:-1].astype(dtype)
            y = buf[1:].astype(dtype)
        else:
            x = np.empty(n, dtype)
            y = np.empty(n, dtype)
            k = 0
            for p in parts:  # stitch: inputs take tokens [0, n), targets [1, n+1)
                a, b = k, k + len(p)
                x[a:min(b, n)] = p[: min(b, n) - a]
                lo = max(a, 1)
                y[lo - 1:b - 1] = p[lo - a:]
                k = b
        pos = pos - 1 if pos else pos  # the last token is the next step's first input
    del x, y
    return time.perf_counter() - t0


def _loader(loader: MixLoader, steps: int) -> float:
    it = iter(loader)
    next(it)  # warm-up (numba compile / cache load)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curation", default=str(REPO / "out/quickstart/manifest.json"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dtype", default="int64", choices=["int64", "int32"])
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    n = RANKS * ROWS * SEQ
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cur, note = _curation(Path(args.curation), tmp)
        t0 = time.perf_counter()
        opened = open_shards(cur, None)  # the verified path every consumer uses
        t_verify = time.perf_counter() - t0
        mbytes = sum(s.path.stat().st_size + s.sidecar.stat().st_size
                     for s in opened.shards) / 1e6
        cm = opened.manifest
        spec = {
            "name": "bench", "manifests": [str(cur)], "seed": 0,
            "target_tokens": (args.steps + 2) * n,
            "sources": {s.name: {"weight": s.mixture_weight, "max_epochs": 1e6}
                        for s in cm.sources if s.tokens.get("train", 0) > 0},
        }
        (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))
        build_mix(tmp / "spec.yaml", tmp / "mix.json")
        full = MixLoader(tmp / "mix.json", seq_len=SEQ, batch_size=RANKS * ROWS, dtype=dtype)
        one = MixLoader(tmp / "mix.json", seq_len=SEQ, batch_size=RANKS * ROWS,
                        world_size=RANKS, rank=0, dtype=dtype)
        mms = [np.asarray(read_tokens(s.path)) for s in opened.shards if s.entry.split == "train"]
        _bare(mms, n, 3, dtype)  # page the shards in
        t_bare = _bare(mms, n, args.steps, dtype)
        t_hot = _bare(mms, n, args.steps, dtype, hot=True)
        t_full = _loader(full, args.steps)
        t_one = _loader(one, args.steps)
    bare = args.steps * n / t_bare
    rows = [
        ("bare np.memmap slice+copy (peer)", n, bare, 1.0),
        ("  same, one cache-hot slice", n, args.steps * n / t_hot,
         (args.steps * n / t_hot) / bare),
        ("MixLoader, global step (512x1024)", n, args.steps * n / t_full,
         (args.steps * n / t_full) / bare),
        ("MixLoader, rank 0 of 8 (64x1024)", n // RANKS, args.steps * n / RANKS / t_one,
         (args.steps * n / RANKS / t_one) / bare),
    ]
    print(f"data: {note}")
    print(f"{args.steps} steps, {args.dtype} inputs+targets, one process, "
          f"NUMBA_NUM_THREADS={os.environ['NUMBA_NUM_THREADS']}")
    print(f"open_shards (sha256 of {len(opened.shards)} shards + sidecars, {mbytes:,.0f} MB): "
          f"{t_verify:.2f} s, {mbytes / max(t_verify, 1e-9):,.0f} MB/s")
    print(f"{'what':38s} {'tokens/step':>11s} {'M tokens/s':>11s} {'ratio':>6s}")
    for what, tok, rate, ratio in rows:
        print(f"{what:38s} {tok:11,d} {rate / 1e6:11.1f} {ratio:6.2f}")
    ok = rows[2][3] >= 0.5 and rows[2][2] >= 50e6
    print(f"target (>= 0.5 of bare and >= 50 M tokens/s, global step): "
          f"{'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
