"""Benchmark: tokenmill.ngram against tokengrams and infini-gram on the same tokens.

Tokens: linux-docs-rst plus the quickstart corpora (c4-en-sample, cc-main-2019-sample,
wikipedia-wikitext-sample, books-public-domain) from ../shared/data/corpora, gpt2, EOT
before every document (about 11 M tokens).

Peers (PyPI wheels, not tokenmill dependencies): ``tokengrams`` (EleutherAI, Rust suffix
array) and ``infini-gram`` (its ``indexing.py`` with the ``rust_indexing`` binary, and its
C++ engine). They are imported from ``--peers`` (default ``$TOKENMILL_BENCH_PEERS`` or
``/tmp/peers_site``), a folder filled with::

    pip install --no-deps --target /tmp/peers_site tokengrams infini-gram

A peer that does not import is reported as "not available".

Measured, in one run:
  * index build time and bytes/token (target: no slower than tokengrams), wall and CPU
    seconds (tokengrams sorts on all cores); also tokenmill's build of the same shards as
    two parts sorted on two threads, and its count latency (each query searches both);
  * count and longest-match latency (median, p99) for single queries and throughput for
    batches of 4,096 (tokengrams and infini-gram have no batched count; their batch
    figure is a Python loop over single queries, the way a caller would have to do it);
  * the online LEM predictor's tokens/s on one core, per causality mode;
  * the compact n-gram counts' size on disk (bytes/token, ratio to the index) and build time.

Usage: ``python benchmarks/bench_ngram.py [--out DIR] [--lem-tokens N]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken"))

from tests.ngram.datamix import write_datamix  # noqa: E402
from tokenmill.manifests.schema import load_manifest  # noqa: E402
from tokenmill.manifests.shards import read_tokens  # noqa: E402
from tokenmill.ngram.counts import build_counts  # noqa: E402
from tokenmill.ngram.index import SuffixArrayIndex, build_index  # noqa: E402
from tokenmill.ngram.lem import OnlineLEM  # noqa: E402

SOURCES = ["linux-docs-rst", "c4-en-sample", "cc-main-2019-sample",
           "wikipedia-wikitext-sample", "books-public-domain"]
EOT = 50256


def import_tokengrams(peers: str):
    """tokengrams' compiled module. Its package ``__init__`` also imports a Hugging Face
    tokenizing helper that needs ``transformers`` (not a tokenmill dependency), so the
    extension is loaded from its file when the plain import fails."""
    try:
        import tokengrams

        return tokengrams
    except ImportError:
        import glob
        import importlib.util

        so = glob.glob(os.path.join(peers, "tokengrams", "tokengrams*.so"))
        if not so:
            raise
        spec = importlib.util.spec_from_file_location("tokengrams", so[0])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def lat(fn, queries) -> tuple[float, float]:
    """(median, p99) latency in µs of fn(q) over queries."""
    t = np.empty(len(queries))
    for i, q in enumerate(queries):
        a = time.perf_counter_ns()
        fn(q)
        t[i] = time.perf_counter_ns() - a
    return float(np.median(t) / 1e3), float(np.percentile(t, 99) / 1e3)


def thr(fn, n) -> float:
    a = time.perf_counter()
    fn()
    return n / (time.perf_counter() - a)


def fmt_ratio(ours: float, peer: float | None, lower_is_better: bool) -> str:
    if peer is None or peer == 0 or ours == 0:
        return "-"
    r = peer / ours if lower_is_better else ours / peer
    return f"{r:.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/tokenmill_bench_ngram")
    ap.add_argument("--peers", default=os.environ.get("TOKENMILL_BENCH_PEERS",
                                                      "/tmp/peers_site"))
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--lem-tokens", type=int, default=0, help="0: the whole stream")
    ap.add_argument("--lem-window", type=int, default=4_000_000)
    args = ap.parse_args()
    out = Path(args.out)
    if Path(args.peers).is_dir():
        sys.path.append(args.peers)

    # ---------------------------------------------------------------- data
    data = out / "data"
    if not (data / "manifest.json").exists():
        t = time.perf_counter()
        write_datamix(SHARED / "corpora", data, SOURCES, max_shard_tokens=4_000_000)
        print(f"tokenized the corpora in {time.perf_counter() - t:.1f} s")
    manifest = load_manifest(data / "manifest.json")
    shards = manifest.shards("train")
    stream = np.concatenate([np.asarray(read_tokens(data / s.path)) for s in shards])
    n = stream.size
    print(f"tokens: {n:,} (train split, {len(shards)} shards); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rows: list[tuple[str, str, str, str, str]] = []  # what, ours, tokengrams, infini, ratio

    # ---------------------------------------------------------------- build
    # one-time library initialisation stays outside the timed builds, as the peers' imports
    # do: pydivsufsort's shared library, and pyarrow's first array conversion (it imports
    # pandas, ~0.3 s)
    import pyarrow as pa
    import pydivsufsort  # noqa: F401

    pa.array([0]).to_numpy()
    ours_dir = out / "ours"
    shutil.rmtree(ours_dir, ignore_errors=True)
    c = time.process_time()
    s = build_index(data / "manifest.json", ours_dir, progress=False)
    ours_build, ours_cpu, ours_bpt = s["seconds"], time.process_time() - c, s["bytes_per_token"]
    index = SuffixArrayIndex(ours_dir)
    # the compact n-gram counts (orders 2-8) beside the index: size and build time
    counts = build_counts(index, ours_dir / "counts", orders=range(2, 9))
    counts_line = (f"n-gram counts (orders 2-8): {counts['bytes'] / 2**20:.1f} MiB, "
                   f"{counts['bytes'] / index.meta['tokens']:.2f} bytes/token, "
                   f"{counts['bytes'] / s['bytes']:.2f}x the index, built in "
                   f"{counts['seconds']:.1f} s")
    # the same shards as ~2 parts sorted on 2 threads (queries then search both parts)
    split_dir = out / "ours_parts"
    shutil.rmtree(split_dir, ignore_errors=True)
    s2 = build_index(data / "manifest.json", split_dir, progress=False,
                     max_part_tokens=n // 2 + len(shards) + 1, workers=2)
    split_index = SuffixArrayIndex(split_dir)

    tg = tg_build = tg_cpu = tg_bpt = None
    try:
        tokengrams = import_tokengrams(args.peers)

        tg_dir = out / "tokengrams"
        shutil.rmtree(tg_dir, ignore_errors=True)
        tg_dir.mkdir(parents=True)
        stream.astype("<u2").tofile(tg_dir / "tokens.bin")
        t, c = time.perf_counter(), time.process_time()
        tg = tokengrams.MemmapIndex.build(str(tg_dir / "tokens.bin"), str(tg_dir / "sa.bin"),
                                          vocab=2**16, verbose=False)
        tg_build, tg_cpu = time.perf_counter() - t, time.process_time() - c
        tg_bpt = sum(f.stat().st_size for f in tg_dir.iterdir()) / n
    except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
        print(f"tokengrams: not available ({type(e).__name__}: {e})")

    ig = ig_build = ig_bpt = None
    try:
        import infini_gram
        from infini_gram.engine import InfiniGramEngine

        ig_dir = out / "infini_gram"
        shutil.rmtree(ig_dir, ignore_errors=True)
        (ig_dir / "raw").mkdir(parents=True)
        idx = ig_dir / "index"
        idx.mkdir()
        # infini-gram's own document separator (0xFFFF) replaces our leading EOT
        starts = np.flatnonzero(stream == EOT)
        toks = stream.astype("<u2").copy()
        toks[starts] = 0xFFFF
        toks.tofile(idx / "tokenized.0")
        (starts.astype("<u8") * 2).tofile(idx / "offset.0")
        script = Path(infini_gram.__file__).parent / "indexing.py"
        t = time.perf_counter()
        r = subprocess.run([sys.executable, str(script), "--data_dir", str(ig_dir / "raw"),
                            "--save_dir", str(idx), "--temp_dir", str(ig_dir / "tmp"),
                            "--token_dtype", "u16", "--cpus", "2", "--mem", "8",
                            "--ulimit", "4096"], capture_output=True, text=True)
        ig_build = time.perf_counter() - t
        if r.returncode != 0:
            raise RuntimeError(r.stdout[-400:] + r.stderr[-400:])
        ig_bpt = sum(f.stat().st_size for f in idx.iterdir()) / n
        ig = InfiniGramEngine(index_dir=str(idx), eos_token_id=EOT, vocab_size=65535)
    except Exception as e:  # noqa: BLE001
        print(f"infini-gram: not available ({type(e).__name__}: {str(e)[:300]})")

    def best_peer(*vals):
        v = [x for x in vals if x is not None]
        return min(v) if v else None

    rows.append(("index build (s)", f"{ours_build:.2f}", f"{tg_build:.2f}" if tg_build else "-",
                 f"{ig_build:.2f}" if ig_build else "-",
                 fmt_ratio(ours_build, tg_build, True)))
    rows.append(("index build CPU s (all threads)", f"{ours_cpu:.2f}",
                 f"{tg_cpu:.2f}" if tg_cpu else "-", "-", fmt_ratio(ours_cpu, tg_cpu, True)))
    rows.append((f"index build, {s2['parts']} parts, 2 threads (s)", f"{s2['seconds']:.2f}",
                 f"{tg_build:.2f}" if tg_build else "-", "-",
                 fmt_ratio(s2["seconds"], tg_build, True)))
    rows.append(("index bytes/token", f"{ours_bpt:.2f}", f"{tg_bpt:.2f}" if tg_bpt else "-",
                 f"{ig_bpt:.2f}" if ig_bpt else "-", fmt_ratio(ours_bpt, tg_bpt, True)))

    # ---------------------------------------------------------------- count
    rng = np.random.default_rng(0)
    qs = []
    while len(qs) < max(args.queries, 4096):
        m = int(rng.integers(1, 9))
        p = int(rng.integers(0, n - m))
        g = stream[p:p + m]
        if (g[1:] == EOT).any():
            continue
        qs.append([int(x) for x in g])
    single = qs[: args.queries]
    batch = qs[:4096]
    want = index.count_batch(batch)
    if tg is not None:  # sanity: same counts (EOT-first n-grams differ by the convention)
        ok = [i for i, q in enumerate(batch[:500]) if q[0] != EOT]
        assert all(tg.count(batch[i]) == want[i] for i in ok), "tokengrams count differs"
    if ig is not None:
        ok = [i for i, q in enumerate(batch[:500]) if q[0] != EOT]
        assert all(ig.count(input_ids=batch[i])["count"] == want[i] for i in ok), \
            "infini-gram count differs"

    for q in single:  # warm the page cache / memory maps of every engine alike
        index.count(q)
        if tg is not None:
            tg.count(q)
        if ig is not None:
            ig.count(input_ids=q)
    o_med, o_p99 = lat(index.count, single)
    t_med = t_p99 = i_med = i_p99 = None
    if tg is not None:
        t_med, t_p99 = lat(tg.count, single)
    if ig is not None:
        i_med, i_p99 = lat(lambda q: ig.count(input_ids=q), single)

    def f(x, unit=""):
        return "-" if x is None else f"{x:.2f}{unit}"

    rows.append(("count single median (µs)", f(o_med), f(t_med), f(i_med),
                 fmt_ratio(o_med, t_med, True)))
    rows.append(("count single p99 (µs)", f(o_p99), f(t_p99), f(i_p99),
                 fmt_ratio(o_p99, t_p99, True)))
    assert (split_index.count_batch(batch) == want).all(), "the split index counts differ"
    for q in single:
        split_index.count(q)
    s_med, _ = lat(split_index.count, single)
    rows.append((f"count single median, {s2['parts']}-part index (µs)", f(s_med), f(t_med), "-",
                 fmt_ratio(s_med, t_med, True)))
    index.count_batch(batch)
    o_b = thr(lambda: index.count_batch(batch), len(batch))
    t_b = thr(lambda: [tg.count(q) for q in batch], len(batch)) if tg is not None else None
    i_b = (thr(lambda: [ig.count(input_ids=q) for q in batch], len(batch))
           if ig is not None else None)
    rows.append(("count batch 4096 (queries/s)", f"{o_b:,.0f}", f"{t_b:,.0f}" if t_b else "-",
                 f"{i_b:,.0f}" if i_b else "-", fmt_ratio(o_b, t_b, False)))

    # ---------------------------------------------------------------- longest match
    ctxs = []
    while len(ctxs) < 4096:
        p = int(rng.integers(64, n))
        c = stream[p - 32:p].astype(np.int64).copy()
        cut = int(rng.integers(0, 32))
        c[:cut] = rng.integers(0, EOT, size=cut)
        ctxs.append([int(x) for x in c])

    def tg_longest(c):  # tokengrams has no ∞-gram query: binary search with `contains`
        lo, hi = 0, len(c) - max((i for i, x in enumerate(c) if x == EOT), default=0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tg.contains(c[len(c) - mid:]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    o_len = index.longest_match_batch(ctxs, k=0)[0]
    if tg is not None:
        assert all(tg_longest(c) == o_len[i] for i, c in enumerate(ctxs[:300])), \
            "tokengrams longest differs"
    index.longest_match_batch(ctxs, k=8)
    # length only: tokengrams (binary search over `contains`)
    lo_med, lo_p99 = lat(lambda c: index.longest_match(c, k=0), ctxs[: args.queries])
    lt_med = lt_p99 = None
    if tg is not None:
        lt_med, lt_p99 = lat(tg_longest, ctxs[: args.queries])
    rows.append(("longest (length) median (µs)", f(lo_med), f(lt_med), "-",
                 fmt_ratio(lo_med, lt_med, True)))
    rows.append(("longest (length) p99 (µs)", f(lo_p99), f(lt_p99), "-",
                 fmt_ratio(lo_p99, lt_p99, True)))
    lo_b = thr(lambda: index.longest_match_batch(ctxs, k=0), len(ctxs))
    lt_b = thr(lambda: [tg_longest(c) for c in ctxs], len(ctxs)) if tg is not None else None
    rows.append(("longest (length) batch 4096 (q/s)", f"{lo_b:,.0f}",
                 f"{lt_b:,.0f}" if lt_b else "-", "-", fmt_ratio(lo_b, lt_b, False)))
    # length + next-token distribution (top 8, exact): infini-gram's infgram_ntd (which
    # enumerates at most max_support=1000 occurrences, sampling beyond)
    ln_med, ln_p99 = lat(lambda c: index.longest_match(c, k=8), ctxs[: args.queries])
    li_med = li_p99 = None
    if ig is not None:
        li_med, li_p99 = lat(lambda c: ig.infgram_ntd(prompt_ids=c), ctxs[: args.queries])
    rows.append(("longest + next top-8 median (µs)", f(ln_med), "-", f(li_med),
                 fmt_ratio(ln_med, li_med, True)))
    rows.append(("longest + next top-8 p99 (µs)", f(ln_p99), "-", f(li_p99),
                 fmt_ratio(ln_p99, li_p99, True)))
    ln_b = thr(lambda: index.longest_match_batch(ctxs, k=8), len(ctxs))
    li_b = (thr(lambda: [ig.infgram_ntd(prompt_ids=c) for c in ctxs], len(ctxs))
            if ig is not None else None)
    rows.append(("longest + next batch 4096 (q/s)", f"{ln_b:,.0f}", "-",
                 f"{li_b:,.0f}" if li_b else "-", fmt_ratio(ln_b, li_b, False)))

    # ---------------------------------------------------------------- online LEM
    lem_n = args.lem_tokens or n
    x = np.ascontiguousarray(stream[:lem_n], dtype=np.int32)
    OnlineLEM(EOT, k=4, mode="step", window=1 << 16).step(x[:5000])  # compile
    OnlineLEM(EOT, k=4, mode="position", window=1 << 16).step(x[:5000])
    lem_rows = []
    step = 8 * 8192
    for mode in ("position", "step"):
        for k in (1, 4):
            lem = OnlineLEM(EOT, k=k, mode=mode, window=args.lem_window)
            a, c = time.perf_counter(), time.process_time()
            lens = [lem.step(x[i:i + step])[0] for i in range(0, lem_n, step)]
            dt, dc = time.perf_counter() - a, time.process_time() - c
            lem_rows.append((mode, k, lem_n / dc, lem_n / dt,
                             float(np.concatenate(lens).mean())))

    # ---------------------------------------------------------------- report
    print()
    head = ("measure", "tokenmill", "tokengrams", "infini-gram", "vs best peer")
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    line = "  ".join(f"{{:<{w[0]}}}" if i == 0 else f"{{:>{w[i]}}}" for i in range(5))
    print(line.format(*head))
    print("  ".join("-" * x for x in w))
    for r in rows:
        print(line.format(*r))
    print("(ratios > 1: tokenmill better: build/latency/bytes ratio = peer / ours, throughput "
          "ratio = ours / peer, against tokengrams where it has the query, else infini-gram)")
    print(counts_line)
    print()
    print(f"online LEM predictor, one core, {lem_n:,} tokens, steps of {step} tokens, "
          f"window {args.lem_window:,} (target: 5 M tokens/s in step mode)")
    print("(M tokens/s per core = tokens / CPU seconds of this process; wall-clock beside it, "
          "lower when other processes share the cores)")
    print(f"{'mode':<10} {'k':>2} {'M tok/s/core':>13} {'vs 5 M':>7} {'M tok/s wall':>13} "
          f"{'mean match len':>15}")
    for mode, k, tps, wall, ml in lem_rows:
        print(f"{mode:<10} {k:>2} {tps / 1e6:>13.2f} {tps / 5e6:>6.2f}x {wall / 1e6:>13.2f} "
              f"{ml:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
