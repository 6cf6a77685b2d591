"""Partitioned exact + fuzzy dedup at scale: throughput, driver and task memory, and the
precision and recall of planted duplicates.

Corpus (per size N, built from ../shared/data/corpora): a pool of the unique lines of at
least 6 words of linux-docs-rst, python-docs-rst, c4-en-sample, cc-main-2019-sample and
wikipedia-wikitext-sample; an original document is 12 random pool lines. Document ``g``
(key ``syn/gNNNNNNNNN``, blocks of 10,000) is, by a hash of ``g``: an original (82%), or a
copy of a random earlier original: an exact copy (6%), a near copy with words replaced so
that its exact word-5-gram Jaccard with the original is about 0.9 (6%) or about 0.7 (6%).
The true Jaccard of every near copy is measured (exact shingle sets) and stored, so the
truth is known: a copy is a true duplicate when its Jaccard is >= the threshold (0.8).

What is timed (each size in a fresh process with its own embedded Ray, ``--cpus``):
the corpus is generated and its prepared blocks (key, text, content hash, MinHash
signature, shingle count: the dedup stages' ``block_columns``) are written by Ray tasks
in one process; then, in a *new* process (the driver measured), the dedup decisions
:func:`tokenmill.pipeline.run.removals.decide_global` (exact then fuzzy, all
phases, removals per block). This calls the dedup stages directly, not ``tokenmill run``.
Printed per size: documents/s of the generation with the block columns ("gen", the
corpus is built in those tasks) and of the decisions ("decide"), the driver's
peak RSS (ru_maxrss of the deciding process, Ray's client included), the largest
dedup task's peak RSS (VmHWM reset at each task start; a Ray worker's baseline of
~150-250 MB included), the partitions used (``--docs-per-partition``), and precision /
recall of the removals against the planted truth.

Usage::

    .venv/bin/python benchmarks/bench_dedup.py --sizes 20000,100000
    .venv/bin/python benchmarks/bench_dedup.py            # 100k and 1M (long)

Last line: ``driver peak RSS growth <first>-><last> documents: X.XXx`` (with the default
sizes ``100k->1M``).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
BLOCK = 10_000
THRESHOLD = 0.8
FUZZY = {"threshold": THRESHOLD, "ngram": 5, "num_perm": 128, "seed": 1, "exact_check": True}
KINDS = (("orig", 0.82), ("exact", 0.06), ("j09", 0.06), ("j07", 0.06))
EDIT_SHARE = {"j09": 0.0105, "j07": 0.0353}  # replaced words per word: J ~0.9 / ~0.7


def _lines() -> list[str]:
    """Unique lines of >= 6 words of the shared corpora, sorted."""
    root = SHARED / "corpora"
    texts: list[str] = []
    for sub in ("linux-docs-rst", "python-docs-rst", "wikipedia-wikitext-sample"):
        texts += [p.read_text(errors="replace") for p in sorted((root / sub).rglob("*.txt"))]
    for p in sorted((root / "c4-en-sample").rglob("*.json.gz")):
        texts += [json.loads(x)["text"] for x in gzip.open(p, "rt")]
    for p in sorted((root / "cc-main-2019-sample").rglob("*.jsonl.gz")):
        texts += [json.loads(x)["text"] for x in gzip.open(p, "rt")]
    return sorted({ln.strip() for t in texts for ln in t.splitlines()
                   if len(ln.split()) >= 6})


def _rng(*parts: object) -> random.Random:
    return random.Random(hashlib.sha256(repr(parts).encode()).digest())


def _kind(g: int) -> str:
    u = _rng("kind", g).random()
    for kind, share in KINDS:
        if u < share:
            return kind
        u -= share
    return "orig"


def _original(g: int, lines: list[str]) -> str:
    r = _rng("orig", g)
    return "\n".join(lines[r.randrange(len(lines))] for _ in range(12))


def _source_of(g: int) -> int:
    """A random earlier original (document 0 is always one)."""
    r = _rng("src", g)
    while True:
        j = r.randrange(g) if g else 0
        if j == 0 or _kind(j) == "orig":
            return j


def _near(text: str, share: float, g: int) -> str:
    """``text`` with ``share`` of its words replaced by new words, at least 5 words
    apart (each edit then changes exactly 5 of the word-5-grams: J = (S-5k)/(S+5k))."""
    words = text.split(" ")
    r = _rng("edit", g)
    slots = max(1, len(words) // 5)
    k = min(slots, max(1, round(share * len(words))))
    for s in r.sample(range(slots), k):
        words[5 * s + r.randrange(5) if 5 * s + 4 < len(words) else 5 * s] = \
            f"zq{r.randrange(10**9)}"
    return " ".join(words)


def _make_block(spec: dict) -> dict:
    """Generate block ``b`` and write its prepared columns and its truth."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenmill.pipeline.dedup.exact import ExactDedup
    from tokenmill.pipeline.dedup.fuzzy import MinHashDedup
    from tokenmill.pipeline.dedup.minhash import shingle_sets
    from tokenmill.pipeline.dedup.minhash.shingle_sets import sorted_jaccard
    from tokenmill.pipeline.run.intermediate import StageOutput
    from tokenmill.pipeline.stage import Document

    lines = json.loads(Path(spec["lines"]).read_text())
    lo, hi = spec["block"] * BLOCK, min(spec["n"], (spec["block"] + 1) * BLOCK)
    docs, truth = [], []
    for g in range(lo, hi):
        kind = _kind(g) if g else "orig"
        src = g if kind == "orig" else _source_of(g)
        text = _original(src, lines)
        if kind in EDIT_SHARE:
            copy = _near(text, EDIT_SHARE[kind], g)
            v, o = shingle_sets([text, copy], FUZZY["ngram"])
            jac = float(sorted_jaccard(v[o[0]:o[1]], v[o[1]:o[2]]))
            text = copy
        else:
            jac = 1.0
        docs.append(Document(key=f"syn/g{g:09d}", source="syn", text=text))
        truth.append((docs[-1].key, kind, f"syn/g{src:09d}", jac))
    cols = {"key": pa.array([d.key for d in docs], pa.string()),
            "text": pa.array([d.text for d in docs], pa.large_string())}
    for st in (ExactDedup(), MinHashDedup(**FUZZY)):
        cols.update(st.block_columns(docs))
    out = StageOutput(spec["work"], "prepare", f"bench{spec['block']:06d}")
    out.dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), out.path(".docs.parquet"))
    pq.write_table(pa.table({c: [t[i] for t in truth] for i, c in
                             enumerate(("key", "kind", "source", "jaccard"))}),
                   Path(spec["work"]) / "truth" / f"{spec['block']:06d}.parquet")
    return {"digest": out.digest}


def generate(n: int, work: Path, cpus: int) -> dict:
    """Child process: the corpus's prepared blocks (Ray tasks)."""
    from tokenmill.pipeline.run.tasks import run_batches
    from tokenmill.raysession import ray_session

    (work / "truth").mkdir(parents=True, exist_ok=True)
    lines_path = work / "lines.json"
    lines_path.write_text(json.dumps(_lines()))
    specs = [{"block": b, "n": n, "work": str(work), "lines": str(lines_path)}
             for b in range(math.ceil(n / BLOCK))]
    with ray_session(None, cpus):
        t0 = time.perf_counter()
        res = run_batches(_make_block, specs, "generate", False, per_task=1)
        seconds = time.perf_counter() - t0
    return {"prepare": [r["digest"] for r in res], "seconds": seconds}


def decide(work: Path, prepare: list[str], parts: int, cpus: int) -> dict:
    """Child process (the measured driver): the partitioned decisions."""
    from tokenmill.pipeline.dedup.exact import ExactDedup
    from tokenmill.pipeline.dedup.fuzzy import MinHashDedup
    from tokenmill.pipeline.run import tasks
    from tokenmill.pipeline.run.removals import decide_global
    from tokenmill.raysession import ray_session

    with ray_session(None, cpus):
        t0 = time.perf_counter()
        per_block, records = decide_global(
            str(work), prepare, [ExactDedup(), MinHashDedup(**FUZZY)], parts)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "removals": [b["removals"] for b in per_block],
            "record": records.get("fuzzy_dedup"),
            "driver_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "task_rss": max(tasks.TASK_PEAK_RSS.values()),
            "task_rss_by_phase": tasks.TASK_PEAK_RSS}


def score(work: Path, removals: list[str]) -> dict:
    """Precision and recall of the removals against the planted truth."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenmill.pipeline.run.intermediate import StageOutput

    truth = pa.concat_tables(pq.read_table(p) for p in sorted((work / "truth").glob("*")))
    removed = {}
    for d in removals:
        t = pq.read_table(StageOutput(work / "dedup", "removals", d).path(".parquet"))
        removed.update(zip(t.column("key").to_pylist(), t.column("stage").to_pylist(),
                           strict=True))
    kinds = truth.column("kind").to_pylist()
    jac = truth.column("jaccard").to_pylist()
    keys = truth.column("key").to_pylist()
    out = {}
    for kind, stage in (("exact", "exact_dedup"), ("j09", "fuzzy_dedup")):
        pos = {k for k, kd, j in zip(keys, kinds, jac, strict=True)
               if kd == kind and j >= THRESHOLD}
        got = {k for k, s in removed.items() if s == stage}
        true_any = {k for k, kd, j in zip(keys, kinds, jac, strict=True)
                    if kd != "orig" and j >= THRESHOLD}
        out[kind] = {"precision": len(got & true_any) / max(1, len(got)) if stage ==
                     "fuzzy_dedup" else len(got & pos) / max(1, len(got)),
                     "recall": len(got & pos) / max(1, len(pos)), "planted": len(pos)}
    j07 = [k for k, kd, j in zip(keys, kinds, jac, strict=True) if kd == "j07" and j < THRESHOLD]
    out["j07_kept"] = sum(k not in removed for k in j07) / max(1, len(j07))
    out["j07_at_threshold"] = sum(kd == "j07" and j >= THRESHOLD
                                  for kd, j in zip(kinds, jac, strict=True))
    out["j07_mean_jaccard"] = (sum(j for kd, j in zip(kinds, jac, strict=True) if kd == "j07")
                               / max(1, len(j07)))
    out["j09_mean_jaccard"] = (sum(j for kd, j in zip(kinds, jac, strict=True) if kd == "j09")
                               / max(1, kinds.count("j09")))
    return out


def _child(args: argparse.Namespace) -> None:
    work = Path(args.work)
    if args.child == "generate":
        res = generate(args.n, work, args.cpus)
    elif args.child == "decide":
        prepare = json.loads((work / "generate.json").read_text())["prepare"]
        res = decide(work, prepare, args.partitions, args.cpus)
    else:
        res = score(work, json.loads((work / "decide.json").read_text())["removals"])
    (work / f"{args.child}.json").write_text(json.dumps(res))


def _run_child(kind: str, n: int, work: Path, parts: int, cpus: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--n", str(n), "--work", str(work),
           "--partitions", str(parts), "--cpus", str(cpus)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads((work / f"{kind}.json").read_text())


def _size(n: int, root: Path, docs_per_partition: int, cpus: int) -> dict:
    work = root / f"n{n}"
    shutil.rmtree(work, ignore_errors=True)
    parts = max(1, math.ceil(n / docs_per_partition))
    gen = _run_child("generate", n, work, parts, cpus)
    dec = _run_child("decide", n, work, parts, cpus)
    sc = _run_child("score", n, work, parts, cpus)
    return {"n": n, "parts": parts, "gen": gen, "dec": dec, "score": sc}


def _print(rows: list[dict]) -> None:
    mb = 1 << 20
    print(f"{'documents':>10} {'parts':>5} {'gen docs/s':>11} {'decide docs/s':>13} "
          f"{'driver RSS MB':>13} {'task RSS MB':>11} {'exact P/R':>11} {'J~0.9 P/R':>11} "
          f"{'J~0.7 kept':>10}")
    for r in rows:
        s, d = r["score"], r["dec"]
        print(f"{r['n']:>10} {r['parts']:>5} {r['n'] / r['gen']['seconds']:>11.0f} "
              f"{r['n'] / d['seconds']:>13.0f} {d['driver_rss'] / mb:>13.1f} "
              f"{d['task_rss'] / mb:>11.1f} "
              f"{s['exact']['precision']:.3f}/{s['exact']['recall']:.3f} "
              f"{s['j09']['precision']:.3f}/{s['j09']['recall']:.3f} {s['j07_kept']:>10.3f}")
    for r in rows:
        s = r["score"]
        phases = ", ".join(f"{k} {v / mb:.0f}" for k, v in r["dec"]["task_rss_by_phase"].items())
        print(f"  n={r['n']}: planted exact {s['exact']['planted']}, J>=0.8 near "
              f"{s['j09']['planted']} (mean J {s['j09_mean_jaccard']:.3f}), J~0.7 mean J "
              f"{s['j07_mean_jaccard']:.3f} ({s['j07_at_threshold']} of them >= 0.8, "
              f"counted as duplicates); fuzzy record {r['dec']['record']['counters']}; "
              f"task peak RSS MB by phase: {phases}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000",
                    help="comma-separated corpus sizes (documents)")
    ap.add_argument("--docs-per-partition", type=int, default=50_000,
                    help="partitions = ceil(documents / this)")
    ap.add_argument("--cpus", type=int, default=min(os.cpu_count() or 1, 8))
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--partitions", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    root = Path(args.work or tempfile.mkdtemp(prefix="bench_dedup_"))
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = [_size(n, root, args.docs_per_partition, args.cpus) for n in sizes]
    _print(rows)
    if args.work is None:
        shutil.rmtree(root, ignore_errors=True)
    first, last = rows[0], rows[-1]
    growth = last["dec"]["driver_rss"] / first["dec"]["driver_rss"]
    print(f"driver peak RSS growth {_short(first['n'])}->{_short(last['n'])} documents: "
          f"{growth:.2f}x")


def _short(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


if __name__ == "__main__":
    main()
