"""MinHash signature throughput: tokenmill vs datasketch vs rensa, same documents, one run.

Documents: linux-docs-rst (all .rst.txt) plus cc-main-2019-sample (../shared/data).
Shingling: word 5-grams after tokenmill's normalization (NFKC, lower case, non-word runs
to one space), num_perm = 128 for every system.

Rows (documents per CPU-second of the process, i.e. per core, best of ``--repeat``;
everything single-threaded, rensa with RAYON_NUM_THREADS=1; CPU time rather than wall
time because the machine is shared):

* tokenmill ``minhash_signatures``: text -> signature, normalization included; and its
  numba kernel alone (input: the texts' UTF-8 bytes; normalization, word splitting and
  hashing included, only ``str.encode`` and batching left out). The kernel lower-cases
  and splits ASCII 64 bytes at a time (SIMD compares and bit masks), maps other code
  points through the NFKC/lower table, hashes each word with MurmurHash64A from 8-byte
  blocks, forms the shingle hashes with Horner's rule in vectorized passes and takes the
  minimum over permutations four at a time (AVX2, 8 uint32 lanes).
* shingle prep (Python): ``shingles(text)`` for the peers (their input), timed apart.
* datasketch ``MinHash.update`` loop (one call per shingle) on a sample (it is slow).
* datasketch ``update_batch`` (one call per document).
* rensa ``RMinHash.update`` (one object per document) and rensa's bulk
  ``RMinHash.digest_matrix_from_token_sets`` (its fastest API).

Peer rates are given for hashing alone (shingles prepared beforehand, the most favourable
reading for them) and end to end (prep + hashing); the ratio columns are tokenmill's
end-to-end (text -> signature) rate over the peer's rate. Then the end-to-end
the single-process ``fuzzy_dedup`` (the test oracle, tests/pipeline/dedup_oracle.py) on
the whole set in a fresh child process: wall time cold (first call: tables, JIT cache
load) and warm, peak traced allocations and the process's peak RSS.

Usage: ``.venv/bin/python benchmarks/bench_minhash.py [--sample 200] [--limit N]``
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def load_docs(limit: int | None = None) -> tuple[list[str], list[str]]:
    keys, texts = [], []
    root = SHARED / "corpora" / "linux-docs-rst" / "data"
    for p in sorted(root.rglob("*.rst.txt")):
        keys.append(f"linux/{p.relative_to(root)}")
        texts.append(p.read_text("utf-8", errors="replace"))
    for f in sorted((SHARED / "corpora" / "cc-main-2019-sample" / "data").glob("*.jsonl.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                keys.append(f"cc/{f.name}#{i:06d}")
                texts.append(json.loads(line)["text"])
    if limit:
        keys, texts = keys[:limit], texts[:limit]
    return keys, texts


def e2e(limit: int | None) -> None:
    """Child mode: fuzzy_dedup over the whole set; prints one JSON line."""
    from tests.pipeline.dedup_oracle import fuzzy_dedup

    keys, texts = load_docs(limit)
    import tracemalloc

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    res = fuzzy_dedup(keys, texts)  # cold: tables, JIT cache load
    cold = time.perf_counter() - t0
    cold_seconds = res.counters["seconds"]
    t0 = time.perf_counter()
    res = fuzzy_dedup(keys, texts)  # warm
    warm = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    fuzzy_dedup(keys, texts)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"docs": len(keys), "cold_s": cold, "warm_s": warm,
                      "peak_rss_mib": rss / 1024, "rss_before_mib": rss0 / 1024,
                      "traced_peak_mib": traced_peak / 2**20, "removed": len(res.removed),
                      "params": res.params, "cold_seconds": cold_seconds,
                      "seconds": res.counters["seconds"]}))


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sample", type=int, default=200,
                    help="documents for the slow datasketch update loop")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N documents")
    ap.add_argument("--repeat", type=int, default=3, help="best-of repeats for fast rows")
    ap.add_argument("--e2e", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.e2e:
        e2e(args.limit)
        return

    # the child runs first, while this process is small: Linux keeps ru_maxrss across exec
    cmd = [sys.executable, __file__, "--e2e"] + (["--limit", str(args.limit)]
                                                 if args.limit else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])

    import numpy as np
    import rensa
    from datasketch import MinHash

    from tokenmill.pipeline.dedup.minhash import minhash_signatures, shingle_hash32, shingles

    keys, texts = load_docs(args.limit)
    n = len(texts)
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 2**20
    print(f"{n} documents ({mb:.1f} MiB), num_perm=128, word 5-grams, 1 thread")
    minhash_signatures(texts[:5])  # numba compile / cache load, not timed

    def timed(fn, repeat: int = 1) -> float:
        """Best CPU seconds of ``repeat`` runs (process time: one core's work, robust to
        other processes sharing the machine)."""
        best = float("inf")
        for _ in range(repeat):
            t = time.process_time()
            fn()
            best = min(best, time.process_time() - t)
        return best

    sig = minhash_signatures(texts, num_perm=128, seed=1)
    t_tm = timed(lambda: minhash_signatures(texts, num_perm=128, seed=1), args.repeat)
    # the numba kernel alone, on UTF-8 bytes (normalization and word splitting included)
    from tokenmill.pipeline.dedup.minhash import kernels, reference, signatures

    prepared = [reference.utf8_bytes(x) for x in texts]
    off = np.zeros(n + 1, np.int64)
    off[1:] = np.cumsum([len(x) for x in prepared])
    buf = np.frombuffer(b"".join(prepared), np.uint8)
    pa, pb = signatures.permutations(128, 1)
    kout = np.empty((n, 128), np.uint32)
    kns = np.empty(n, np.int64)
    t_kernel = timed(lambda: kernels.signatures_kernel(buf, off, 5, pa, pb,
                                                       kernels.char_tables(), kout, kns),
                     args.repeat)
    assert np.array_equal(kout, sig)
    sh = [shingles(x) for x in texts]
    t_prep = timed(lambda: [shingles(x) for x in texts])
    n_sh = sum(map(len, sh))

    sample = sh[: args.sample]

    def ds_loop():
        for s in sample:
            m = MinHash(num_perm=128, seed=1, hashfunc=shingle_hash32)
            for x in s:
                m.update(x)
        return m

    m = ds_loop()
    # same hash function as tokenmill: identical signatures (spot check on the sample)
    assert np.array_equal(m.hashvalues, sig[len(sample) - 1])
    t_ds_loop = timed(ds_loop) * n / max(1, len(sample))  # scaled to all documents

    def ds_batch():
        for s in sh:
            m = MinHash(num_perm=128, seed=1)
            m.update_batch(s)

    t_ds_batch = timed(ds_batch)
    sh_str = [[x.decode("utf-8", "surrogatepass") for x in s] for s in sh]

    def rensa_update():
        for s in sh_str:
            r = rensa.RMinHash(num_perm=128, seed=1)
            r.update(s)
            r.digest()

    t_rensa = timed(rensa_update, args.repeat)
    t_rensa_bulk = timed(lambda: rensa.RMinHash.digest_matrix_from_token_sets(
        sh_str, num_perm=128, seed=1), args.repeat)

    tm_rate = rate(n, t_tm)
    rows = [("tokenmill minhash_signatures (text -> sig)", t_tm, None)]
    rows.append(("tokenmill numba kernel only (UTF-8 bytes in)", t_kernel, None))
    rows.append(("shingle prep for peers (Python)", t_prep, None))
    rows.append((f"datasketch update loop (sample {len(sample)})", t_ds_loop, t_prep))
    rows.append(("datasketch update_batch", t_ds_batch, t_prep))
    rows.append(("rensa RMinHash.update", t_rensa, t_prep))
    rows.append(("rensa digest_matrix_from_token_sets", t_rensa_bulk, t_prep))
    print(f"\ndocuments per CPU-second (best of {args.repeat} for tokenmill and rensa)")
    print(f"{'system':45s} {'hash docs/s':>12s} {'e2e docs/s':>12s} "
          f"{'tm/peer(hash)':>14s} {'tm/peer(e2e)':>13s}")
    for name, secs, prep in rows:
        if prep is None:
            print(f"{name:45s} {rate(n, secs):12,.0f} {'':>12s}")
            continue
        h, e = rate(n, secs), rate(n, secs + prep)
        print(f"{name:45s} {h:12,.0f} {e:12,.0f} {tm_rate / h:13.2f}x {tm_rate / e:12.2f}x")
    print(f"\nshingles: {n_sh:,} ({n_sh / n:.0f}/doc); tokenmill "
          f"{t_tm / n_sh * 1e9:.0f} ns/shingle end to end")

    print("\nend-to-end single-process fuzzy_dedup (child process):")
    print(f"  {res['docs']} docs, removed {res['removed']}, bands x rows = "
          f"{res['params']['bands']} x {res['params']['rows']}")
    print(f"  cold (first call: tables, JIT cache load): wall {res['cold_s']:.2f} s "
          f"{res['cold_seconds']}")
    print(f"  warm: wall {res['warm_s']:.2f} s "
          f"{res['seconds']}")
    print(f"  memory: peak allocations during a call {res['traced_peak_mib']:.0f} MiB "
          f"(tracemalloc: Python + numpy); driver process peak RSS "
          f"{res['peak_rss_mib']:.0f} MiB after two calls, {res['rss_before_mib']:.0f} MiB "
          "before them (imports, Ray client, the loaded texts)")


if __name__ == "__main__":
    main()
