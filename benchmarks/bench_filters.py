"""Benchmark: tokenmill's quality filters against datatrove's, same documents, one process.

Runs the four heuristic filters (Gopher quality, Gopher repetition, C4, FineWeb; default
parameters) of both implementations over the same documents (read and normalized as a
curation run does) on one core, and prints documents/s per filter and for all four, the
ratio, and how often the two agree (keep/remove, each filter alone). The two run
interleaved, document by document, so both see the same machine load. tokenmill's caches
start empty; both sides get one warm-up document (spaCy's and numba's first-call cost).

Usage: ``python benchmarks/bench_filters.py [--corpora c4-en-sample cc-main-2019-sample]
[--limit N]`` (needs the ``dev`` extra: datatrove and spaCy; corpora under
``../shared/data/corpora`` or ``TOKENMILL_DATA_ROOT``). The target: tokenmill at
least 10x datatrove.

``--stages`` also runs :mod:`bench_curation_stages` (PII, URL filter and classifier
against datatrove's PIIFormatter and URLFilter and fastText's own predict loop).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tokenmill.pipeline.document import analysis
from tokenmill.pipeline.document.quality import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.read.readers import read_file
from tokenmill.pipeline.read.sources import list_files
from tokenmill.pipeline.stage import Document

ROOT = Path(os.environ.get("TOKENMILL_DATA_ROOT",
                           Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora"))
NAMES = ("gopher_quality", "gopher_repetition", "c4", "fineweb")


def load_texts(corpora: list[str], limit: int | None) -> list[str]:
    """Normalized, non-empty texts of every document of ``corpora``, in file order."""
    texts = []
    for name in corpora:
        root = ROOT / name
        files = list_files(root)
        for rel in files:
            for d in read_file(root, rel, name):
                if isinstance(d, Document) and (t := normalize_text(d.text)).strip():
                    texts.append(t)
    return texts[:limit]


def _ours() -> dict:
    filters = {"gopher_quality": GopherQualityFilter(),
               "gopher_repetition": GopherRepetitionFilter(), "c4": C4QualityFilter(),
               "fineweb": FineWebQualityFilter()}
    for f in filters.values():  # warm-up (numba), then empty caches
        f.reason(Document(key="w", source="w", text="A warm up text. " * 60))
    analysis.reset()
    return {n: (lambda t, f=f: f.reason(Document(key="k", source="s", text=t)) is None)
            for n, f in filters.items()}


def _datatrove() -> dict:
    from datatrove.data import Document as DtDocument
    from datatrove.pipeline.filters import (
        C4QualityFilter as DtC4,
    )
    from datatrove.pipeline.filters import (
        FineWebQualityFilter as DtFineWeb,
    )
    from datatrove.pipeline.filters import (
        GopherQualityFilter as DtGopherQuality,
    )
    from datatrove.pipeline.filters import (
        GopherRepetitionFilter as DtGopherRepetition,
    )

    filters = {"gopher_quality": DtGopherQuality(), "gopher_repetition": DtGopherRepetition(),
               "c4": DtC4(), "fineweb": DtFineWeb()}
    for f in filters.values():
        f.filter(DtDocument(text="A warm up text. " * 60, id="w"))

    def keep(f, t: str) -> bool:
        r = f.filter(DtDocument(text=t, id="k"))
        return r if isinstance(r, bool) else r[0]

    return {n: (lambda t, f=f: keep(f, t)) for n, f in filters.items()}


def run_both(texts: list[str]) -> dict[str, tuple[dict[str, float], dict[str, list[bool]]]]:
    """Per document, tokenmill's four filters then datatrove's, so both see the same
    machine load; each filter timed alone. Returns side → (seconds, keep decisions)."""
    sides = {"tokenmill": _ours(), "datatrove": _datatrove()}
    out = {side: (dict.fromkeys(NAMES, 0.0), {n: [] for n in NAMES}) for side in sides}
    for t in texts:
        for side, filters in sides.items():
            secs, keep = out[side]
            for n in NAMES:
                t0 = time.perf_counter()
                keep[n].append(filters[n](t))
                secs[n] += time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", nargs="+", default=["c4-en-sample", "cc-main-2019-sample"])
    ap.add_argument("--limit", type=int, default=None, help="first N documents only")
    ap.add_argument("--stages", action="store_true", help="also PII, URL filter, classifier")
    args = ap.parse_args()
    texts = load_texts(args.corpora, args.limit)
    n = len(texts)
    res = run_both(texts)
    ours, ok = res["tokenmill"]
    ref, rk = res["datatrove"]
    print(f"{n} documents ({', '.join(args.corpora)}), one process, one core\n")
    print(f"{'filter':<18} {'tokenmill doc/s':>16} {'datatrove doc/s':>16} {'ratio':>7} "
          f"{'agree':>8}")
    for name in NAMES:
        agree = sum(a == b for a, b in zip(ok[name], rk[name], strict=True)) / max(1, n)
        print(f"{name:<18} {n / ours[name]:>16.0f} {n / ref[name]:>16.1f} "
              f"{ref[name] / ours[name]:>6.1f}x {100 * agree:>7.2f}%")
    to, tr = sum(ours.values()), sum(ref.values())
    print(f"{'all four':<18} {n / to:>16.0f} {n / tr:>16.1f} {tr / to:>6.1f}x")
    if args.stages:
        import bench_curation_stages

        bench_curation_stages.run(None, 64, args.limit)


if __name__ == "__main__":
    main()
