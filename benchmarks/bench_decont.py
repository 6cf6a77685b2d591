"""Decontamination's cost per training document against the eval sets' size.

Eval sets (per size E, built from ../shared/data/corpora): example ``i`` has a 16-word
question and a 16-word answer, each a run of consecutive normalized words of the shared
corpora at a seeded random place with 2 of its words replaced by random corpus words (so
that examples differ and read like the corpora). Written as one parquet file per size;
its index (:func:`tokenmill.pipeline.decont.index.ensure_index`, n = 12, overlap n-grams
on) is built under ``--work`` and reused on a rerun (content-addressed).

Training documents: the documents of c4-en-sample, cc-main-2019-sample and
wikipedia-wikitext-sample, read and normalized as a curation run does. Timed: the
decontamination stage over all of them (:class:`Decontaminate`, the stage object a worker
runs: normalized words, n-gram hashes, one :func:`numpy.searchsorted` over the
memory-mapped index), once per size to warm up (the index paged in, the examples table
read on the first match), then ``--repeats`` rounds over the sizes in turn, the fastest
pass kept, in CPU time of this process (the machine may be shared); printed per size: the
index build (or lookup) time, hashes in the index, CPU microseconds per document and
documents removed.

Usage::

    .venv/bin/python benchmarks/bench_decont.py                     # 1k and 1M examples
    .venv/bin/python benchmarks/bench_decont.py --sizes 1000,100000

Last line: ``cost per document <first>-><last> eval examples: X.XXx``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.pipeline.decont_data import corpus_texts  # noqa: E402
from tokenmill.pipeline.decont.index import ensure_index  # noqa: E402
from tokenmill.pipeline.decont.text import normalized_words  # noqa: E402
from tokenmill.pipeline.document.decontaminate import Decontaminate  # noqa: E402
from tokenmill.pipeline.stage import Document  # noqa: E402

TRAIN = ("c4-en-sample", "cc-main-2019-sample", "wikipedia-wikitext-sample")
POOL = ("books-public-domain", "python-docs-rst", "wikipedia-wikitext-sample")


def _pool() -> np.ndarray:
    words = [w for _, t in corpus_texts(POOL) for w in normalized_words(t)]
    return np.array(words, dtype=object)


def write_eval_set(path: Path, size: int, pool: np.ndarray, seed: int = 0) -> Path:
    """``size`` synthetic examples (see the module docstring) as parquet at ``path``."""
    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(pool) - 16, size=(size, 2))
    swaps = rng.integers(0, 16, size=(size, 2, 2))
    fill = rng.integers(0, len(pool), size=(size, 2, 2))
    texts: list[list[str]] = [[], []]
    for i in range(size):
        for part in (0, 1):
            words = list(pool[starts[i, part]:starts[i, part] + 16])
            for s, f in zip(swaps[i, part], fill[i, part], strict=True):
                words[s] = pool[f]
            texts[part].append(" ".join(words))
    table = pa.table({"id": [f"syn-{i}" for i in range(size)], "question": texts[0],
                      "answer": texts[1]})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _pass(stage: Decontaminate, docs: list[Document]) -> tuple[float, int]:
    """CPU seconds of one pass of ``stage`` over ``docs`` (process time: other processes
    on the machine do not count), and the documents it removed."""
    t0 = time.process_time()
    kept = sum(1 for _ in stage(docs))
    return time.process_time() - t0, len(docs) - kept


def _index(size: int, pool: np.ndarray, work: Path) -> tuple[str, float]:
    path = write_eval_set(work / f"eval-{size}.parquet", size, pool)
    decont = {"eval_sets": [{"name": "syn", "path": str(path), "answer_field": "answer",
                             "prompt_field": "question", "id_field": "id"}],
              "n": 12, "query_ngrams": False, "overlap_ngrams": True}
    t0 = time.perf_counter()
    index = ensure_index(decont, None, work / "work")
    return index, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,1000000", help="eval examples, comma-separated")
    ap.add_argument("--work", default="/tmp/tokenmill-bench-decont", help="eval files + index")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    docs = [Document(key=k, source="train", text=t) for k, t in corpus_texts(TRAIN)]
    pool = _pool()
    print(f"{len(docs)} training documents; pool of {len(pool):,} corpus words")
    stages, removed = [], []
    for size in sizes:
        index, build = _index(size, pool, Path(args.work))
        stages.append(Decontaminate(index=index, n=12))
        removed.append(_pass(stages[-1], docs)[1])  # warm-up
        hashes = np.load(Path(index) / "hashes.npy", mmap_mode="r")
        print(f"{size:>9,} examples: index built or found in {build:7.1f} s, "
              f"{len(hashes):,} hashes")
    best = [float("inf")] * len(sizes)
    for _ in range(args.repeats):  # interleaved, so that drifts in load hit every size
        for i, stage in enumerate(stages):
            best[i] = min(best[i], _pass(stage, docs)[0])
    for size, seconds, gone in zip(sizes, best, removed, strict=True):
        print(f"{size:>9,} examples: {1e6 * seconds / len(docs):8.1f} us CPU/document, "
              f"{gone} documents removed")
    print(f"cost per document {sizes[0]}->{sizes[-1]} eval examples: "
          f"{best[-1] / best[0]:.2f}x")


if __name__ == "__main__":
    main()
