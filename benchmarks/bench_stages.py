"""Benchmark: each per-document stage alone, same documents, one process, one core.

Every document of the C4 and Common Crawl samples (``c4-en-sample``,
``cc-main-2019-sample``), read and normalized as a run does, repeated (as new string
objects, so no per-text cache can hit across copies) to about ``--mb`` MB of UTF-8 text.
After a warm-up pass over the first documents (numba compilation, tiktoken and fastText
loading), each stage runs alone over fresh copies of all documents, called the way the
executor calls it (``stage(docs)``, one block at a time), and prints MB/s and documents/s
of CPU time (``time.process_time``: one thread, so per core, and little moved by other
processes on a shared machine).

Also printed, measured in the same run on the same texts:

* ``quality (4 together)``: the four quality filters chained over each block, as a run
  has them, each deciding on every document (none removed, so each filter sees all);
* ``fastText predict loop``: the peer of the language stage, ``model.predict(line)`` per
  document on the lines the stage hands to fastText, prepared beforehand (what the
  language stage would cost with fastText's own Python API; the stage computes the same
  predictions in numba, float for float); ``fastText, whole texts``:
  ``model.predict(text.replace("\n", " "))`` per document, as datatrove's filter calls it
  (the stage and both peers timed block by block in turn, so that they share the load);
* ``per-document path``: read, normalize, length, the four filters, language, the exact
  and fuzzy dedup columns and tokenize, every stage on every document (the sum of their
  seconds over the same documents), in MB/s per core.

Usage: ``python benchmarks/bench_stages.py [--mb 25] [--block 1000]``
(corpora under ``../shared/data/corpora`` or ``TOKENMILL_DATA_ROOT``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared/data/tiktoken"))

from tokenmill.pipeline.dedup.exact import ExactDedup  # noqa: E402
from tokenmill.pipeline.dedup.fuzzy import MinHashDedup  # noqa: E402
from tokenmill.pipeline.document.language import LanguageFilter, fasttext_lines  # noqa: E402
from tokenmill.pipeline.document.length import LengthFilter  # noqa: E402
from tokenmill.pipeline.document.quality import build_quality_filter  # noqa: E402
from tokenmill.pipeline.read.normalize import Normalize, normalize_text  # noqa: E402
from tokenmill.pipeline.read.readers import read_file  # noqa: E402
from tokenmill.pipeline.read.sources import list_files  # noqa: E402
from tokenmill.pipeline.run.tokenize import tokenize_batch  # noqa: E402
from tokenmill.pipeline.stage import Document, DocumentFilter  # noqa: E402

ROOT = Path(os.environ.get("TOKENMILL_DATA_ROOT", REPO.parent / "shared/data/corpora"))
CORPORA = ("c4-en-sample", "cc-main-2019-sample")
QUALITY = ("gopher_quality", "gopher_repetition", "c4", "fineweb")


def read_all() -> tuple[list[Document], float]:
    """Every readable document of :data:`CORPORA` (raw text) and the seconds reading took."""
    t0 = time.process_time()
    docs = []
    for name in CORPORA:
        files = list_files(ROOT / name)
        for rel in files:
            docs += [d for d in read_file(ROOT / name, rel, name) if isinstance(d, Document)]
    return docs, time.process_time() - t0


def copies(texts: list[str]) -> list[Document]:
    """Fresh documents holding new string objects equal to ``texts``."""
    return [Document(key=f"k{i:08d}", source="s", text=(t + " ")[:-1])
            for i, t in enumerate(texts)]


def blocks_of(docs: list[Document], size: int) -> list[list[Document]]:
    return [docs[i:i + size] for i in range(0, len(docs), size)]


def every_document(f: DocumentFilter) -> Callable[[Iterable[Document]], Iterator[Document]]:
    """``f`` deciding on every document and removing none (so the next stage sees all)."""
    def run(docs: Iterable[Document]) -> Iterator[Document]:
        for d in docs:
            f.reason(d)
            yield d
    return run


def time_steps(make: Callable[[], list], texts: list[str], block: int) -> float:
    """Seconds for the chained steps ``make()`` over fresh copies of ``texts``, block by
    block."""
    steps = make()
    secs = 0.0
    for b in blocks_of(copies(texts), block):
        t0 = time.process_time()
        it = iter(b)
        for s in steps:
            it = s(it)
        for _ in it:
            pass
        secs += time.process_time() - t0
    return secs


def time_columns(step, texts: list[str], block: int) -> float:
    secs = 0.0
    for b in blocks_of(copies(texts), block):
        t0 = time.process_time()
        step.block_columns(b)
        secs += time.process_time() - t0
    return secs


def time_tokenize(texts: list[str], block: int) -> float:
    t0 = time.process_time()
    for i in range(0, len(texts), block):
        tokenize_batch(texts[i:i + block], "gpt2")
    return time.process_time() - t0


def time_fasttext_peer(model, texts: list[str], whole: bool) -> float:
    """fastText's own ``predict`` per document: on the lines the language stage reads
    (prepared beforehand, not timed), or (``whole``) on each whole text with its
    newlines made spaces, as datatrove's language filter calls it."""
    lines = texts if whole else fasttext_lines(texts, 20_000)
    t0 = time.process_time()
    for line in lines:
        if whole:
            line = line.replace("\n", " ")
        if line:
            model.predict(line, k=1)
    return time.process_time() - t0


def time_language(texts: list[str], block: int) -> dict[str, float]:
    """Seconds of the language stage and of its two fastText peers, taken block by block
    in turn on the same texts (so that a change in the machine's load falls on all
    three alike)."""
    import fasttext

    from tokenmill.pipeline.document.language import fasttext_model_path

    model = fasttext.load_model(str(fasttext_model_path()))
    secs = dict.fromkeys(("language", "fastText predict loop", "fastText, whole texts"), 0.0)
    for i in range(0, len(texts), block):
        part = texts[i:i + block]
        secs["language"] += time_steps(lambda: [LanguageFilter(languages=None)], part, block)
        secs["fastText predict loop"] += time_fasttext_peer(model, part, whole=False)
        secs["fastText, whole texts"] += time_fasttext_peer(model, part, whole=True)
    return secs


def stage_table(texts: list[str], block: int) -> dict[str, float]:
    """Seconds per stage (and the combined rows) over ``texts``."""
    def one(name: str) -> Callable[[], list]:
        return lambda: [build_quality_filter(name)]

    secs = {"normalize": time_steps(lambda: [Normalize()], texts, block),
            "length": time_steps(lambda: [LengthFilter()], texts, block)}
    for name in QUALITY:
        secs[name] = time_steps(one(name), texts, block)
    secs["quality (4 together)"] = time_steps(
        lambda: [every_document(build_quality_filter(n)) for n in QUALITY], texts, block)
    secs.update(time_language(texts, block))
    secs["exact dedup columns"] = time_columns(ExactDedup(), texts, block)
    secs["fuzzy dedup columns"] = time_columns(MinHashDedup(), texts, block)
    secs["tokenize"] = time_tokenize(texts, block)
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=25.0, help="MB of text per stage")
    ap.add_argument("--block", type=int, default=1000, help="documents per block")
    args = ap.parse_args()
    raw, read_s = read_all()
    raw_mb = sum(len(d.text.encode()) for d in raw) / 1e6
    texts = [t for d in raw if (t := normalize_text(d.text)).strip()]
    reps = max(1, round(args.mb / raw_mb))
    data = texts * reps
    mb = sum(len(t.encode()) for t in data) / 1e6
    stage_table(texts[:300], args.block)  # warm-up: numba, tiktoken, fastText, caches
    secs = stage_table(data, args.block)
    n = len(data)
    print(f"{len(texts)} documents x {reps} = {n} documents, {mb:.1f} MB, one process, "
          f"blocks of {args.block}\n")
    print(f"{'stage':<24} {'MB/s':>8} {'docs/s':>9}")
    print(f"{'read':<24} {raw_mb / read_s:>8.1f} {len(raw) / read_s:>9.0f}"
          f"   (one pass over the files, {raw_mb:.1f} MB)")
    for name, s in secs.items():
        print(f"{name:<24} {mb / s:>8.1f} {n / s:>9.0f}")
    path = ["normalize", "length", "quality (4 together)", "language", "exact dedup columns",
            "fuzzy dedup columns", "tokenize"]
    total = read_s * reps + sum(secs[k] for k in path)
    print(f"{'per-document path':<24} {mb / total:>8.1f} {n / total:>9.0f}"
          "   (read -> tokenize, every stage on every document)")
    for peer in ("fastText predict loop", "fastText, whole texts"):
        print(f"language / {peer}: {secs[peer] / secs['language']:.2f}x")


if __name__ == "__main__":
    main()
