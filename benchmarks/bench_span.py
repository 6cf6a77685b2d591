"""Sentence-span dedup vs datatrove 0.10.1's three ``SentenceDedup`` steps (signature,
finder, filter; its defaults: 3-sentence windows, spaCy's English sentencizer) on the same
documents, one core: CPU seconds, documents/s and MB/s, ratio, and how many documents
each cuts or removes.

tokenmill: :func:`tokenmill.pipeline.dedup.span_units.dedup_texts` (the stage's rules in
one process: units, window keys, first occurrences, cuts, minimums). The documents:
the cc, c4 and wikipedia samples (normalized as a run does), ``--copies`` times, each
copy after the first with about 3 % of its words replaced (``bench_scale.py``'s
perturbation), so that most windows of a copy repeat and some do not.

    .venv/bin/python benchmarks/bench_span.py [--copies 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from bench_scale import _perturb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def documents(copies: int) -> list[str]:
    from tests.pipeline.decont_data import corpus_texts

    texts = [t for _, t in corpus_texts(("cc-main-2019-sample", "c4-en-sample",
                                         "wikipedia-wikitext-sample"))]
    out = list(texts)
    for c in range(1, copies):
        rng = random.Random(f"copy-{c}")
        out += [_perturb(t, rng) for t in texts]
    return out


def datatrove(texts: list[str]) -> list[str | None]:
    import xxhash
    from datatrove.data import Document
    from datatrove.pipeline.dedup import sentence_dedup as sd
    from datatrove.utils.hashes import xxhash as dt_xxhash

    # xxhash >= 4 hashes bytes only; datatrove 0.10.1 passes str (xxhash 3 took UTF-8)
    dt_xxhash.xxhash64 = lambda d: xxhash.xxh64_intdigest(
        d.encode() if isinstance(d, str) else d)
    cfg = sd.SentDedupConfig()
    folder = Path(tempfile.mkdtemp())

    def docs():
        return (Document(text=t, id=str(i)) for i, t in enumerate(texts))
    sd.SentenceDedupSignature(str(folder / "s"), config=cfg, language="en").run(docs())
    sd.SentenceFindDedups(str(folder / "s"), str(folder / "d"), config=cfg).run()
    kept = {d.id: d.text for d in sd.SentenceDedupFilter(str(folder / "d"), config=cfg,
                                                         language="en").run(docs())}
    return [kept.get(str(i)) for i in range(len(texts))]


def tokenmill(texts: list[str]) -> list[str | None]:
    from tokenmill.pipeline.dedup.span_units import apply_cuts, dedup_texts

    return [None if why else apply_cuts(t, cuts)
            for t, (cuts, why) in zip(texts, dedup_texts(texts), strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=2)
    args = ap.parse_args()
    texts = documents(args.copies)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    rows = []
    for name, fn in (("datatrove", datatrove), ("tokenmill", tokenmill)):
        cpu = time.process_time()
        kept = fn(texts)
        cpu = time.process_time() - cpu
        cut = sum(1 for k, t in zip(kept, texts, strict=True) if k is not None and k != t)
        rows.append((name, cpu, sum(k is None for k in kept), cut))
        print(f"{name:10} {cpu:8.1f} CPU s {len(texts) / cpu:9.0f} docs/s {mb / cpu:6.2f} MB/s "
              f"removed {rows[-1][2]:6,} cut {cut:6,}", flush=True)
    print(f"{len(texts):,} documents, {mb:.1f} MB; tokenmill vs datatrove: "
          f"{rows[0][1] / rows[1][1]:.2f}x")


if __name__ == "__main__":
    main()
