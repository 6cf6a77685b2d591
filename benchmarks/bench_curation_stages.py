"""Benchmark: tokenmill's PII, URL-filter and classifier stages against their peers, same
documents, one process, one core (run from ``benchmarks/bench_filters.py --stages``, or
alone).

* PII: :class:`~tokenmill.pipeline.document.pii.PIIRedact` (emails and IPv4; IPv6 on a
  separate line) against datatrove's ``PIIFormatter.format``, with an edit sink as a run
  has one.
* URL filter: :class:`~tokenmill.pipeline.document.url_filter.URLFilter` against
  datatrove's ``URLFilter.filter``, both with the lists datatrove ships (loaded before
  timing), over the documents that carry a URL (C4 ``url``, CC ``metadata.url``).
* classifier: :class:`~tokenmill.pipeline.document.classifier.ClassifierFilter` against
  fastText's own ``predict`` loop as DCLM writes it (one document per call, its lines
  joined), with the same model: ``--model``, or one trained here on the DCLM labels.

Documents/s and MB/s (UTF-8 text of the documents) per core; the two sides alternate in
rounds of ``--batch`` documents so both see the same machine load. The target: tokenmill not
slower than the peer on any stage. Needs the dev extra (datatrove, tldextract,
pyahocorasick) and a fastText module that trains (fasttext-numpy2) unless ``--model``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(os.environ.get("TOKENMILL_DATA_ROOT",
                           Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora"))


def load_docs() -> list[tuple[str, str]]:
    """``(text, url)`` of the C4 and CC samples."""
    out = []
    for p in sorted((ROOT / "c4-en-sample" / "data").glob("*.json.gz")):
        out += [(r["text"], r["url"]) for r in map(json.loads, gzip.open(p, "rt"))]
    for p in sorted((ROOT / "cc-main-2019-sample" / "data").glob("*.jsonl.gz")):
        out += [(r["text"], r["metadata"]["url"]) for r in map(json.loads, gzip.open(p, "rt"))]
    return out


def alternate(items: list, sides: dict[str, Callable[[list], None]], batch: int
              ) -> dict[str, float]:
    """Seconds per side over ``items``, the sides taking turns per batch (each side warmed
    up on the first item first: lazy imports, tldextract's suffix trie)."""
    for fn in sides.values():
        fn(items[:1])
    secs = dict.fromkeys(sides, 0.0)
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn(chunk)
            secs[name] += time.perf_counter() - t0
    return secs


def _pii_sides() -> dict[str, Callable[[list], None]]:
    from datatrove.pipeline.formatters.pii import PIIFormatter

    from tokenmill.pipeline.document.pii import PIIRedact
    from tokenmill.pipeline.stage import Document

    theirs = PIIFormatter()
    ours, ours6 = PIIRedact(ipv6=False), PIIRedact()
    sink: list = []
    ours.sink = ours6.sink = sink.append

    def run(stage):
        def go(texts: list[str]) -> None:
            list(stage.run(Document("s/f#0", "s", t) for t in texts))
            sink.clear()
        return go
    return {"tokenmill": run(ours), "datatrove": lambda ts: [theirs.format(t) for t in ts],
            "tokenmill +IPv6": run(ours6)}


def _url_sides(tmp: Path) -> dict[str, Callable[[list], None]]:
    from datatrove.data import Document as DtDocument
    from datatrove.pipeline.filters import url_filter
    from datatrove.utils._import_utils import ASSETS_PATH

    from tokenmill.pipeline.document.url_filter import URLFilter, _extractor
    from tokenmill.pipeline.stage import Document

    url_filter.cached_assets_path = lambda **kw: str(tmp)
    theirs = url_filter.URLFilter()
    theirs.tldextractor = _extractor()
    theirs.download_data()
    a = Path(ASSETS_PATH)
    ours = URLFilter(archive=str(a / "url_filterblacklistsv0_3_0.tar.gz"),
                     banned_words=[str(a / "banned_words.txt")],
                     banned_subwords=[str(a / "banned_subwords.txt")],
                     soft_banned_words=[str(a / "soft_banned_words.txt")])
    ours.lists  # noqa: B018 (loaded before timing, as datatrove's)
    ours.sink = lambda r: None
    return {"tokenmill": lambda ds: list(ours.run(Document("s/f#0", "s", t, {"url": u})
                                                  for t, u in ds)),
            "datatrove": lambda ds: [theirs.filter(DtDocument(text=t, id="0",
                                                              metadata={"url": u}))
                                     for t, u in ds]}


def _train_model(tmp: Path) -> str:
    from tokenmill.pipeline.classifier_train import TrainParams, fit, read_texts
    from tokenmill.pipeline.document.classifier import prepare_text

    d = ROOT / "dclm-quality-labels" / "data"
    files = [d / "agreement_data.jsonl", d / "majority_data.jsonl"]
    pos = read_texts([f"{f}:label=1" for f in files])
    neg = read_texts([f"{f}:label=0" for f in files])
    model = fit([prepare_text(t) for t in pos + neg], [1] * len(pos) + [0] * len(neg),
                TrainParams(bucket=100_000))
    path = str(tmp / "model.bin")
    model.save_model(path)
    return path


def _classifier_sides(model_path: str) -> dict[str, Callable[[list], None]]:
    import fasttext

    from tokenmill.pipeline.document.classifier import ClassifierFilter
    from tokenmill.pipeline.stage import Document

    ours = ClassifierFilter(model=model_path, label="hq", threshold=0.5, digest="bench")
    ours.sink = lambda r: None
    model = fasttext.load_model(model_path)

    def dclm_loop(texts: list[str]) -> None:  # DCLM's classify_fasttext_hq_prob, per document
        for t in texts:
            labels, probs = model.predict(" ".join(t.strip().splitlines()))
            _ = probs[0] if labels[0] == "__label__hq" else 1 - probs[0]
    return {"tokenmill": lambda ts: list(ours.run(Document("s/f#0", "s", t) for t in ts)),
            "fastText predict": dclm_loop}


def run(model: str | None, batch: int, limit: int | None) -> None:
    """Print the table (see the module docstring)."""
    docs = load_docs()[:limit]
    texts = [t for t, _ in docs]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    n = len(docs)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {"pii": alternate(texts, _pii_sides(), batch),
                "url_filter": alternate(docs, _url_sides(Path(tmp)), batch),
                "classifier": alternate(texts, _classifier_sides(model or _train_model(
                    Path(tmp))), batch)}
    print(f"\n{n} documents, {mb:.1f} MB (c4-en-sample, cc-main-2019-sample), one core\n")
    print(f"{'stage':<12} {'side':<17} {'doc/s':>9} {'MB/s':>8} {'vs peer':>8}")
    for stage, secs in rows.items():
        peer = [s for s in secs if not s.startswith("tokenmill")][0]
        for side, s in secs.items():
            ratio = f"{secs[peer] / s:.2f}x" if side != peer else ""
            print(f"{stage:<12} {side:<17} {n / s:>9.0f} {mb / s:>8.2f} {ratio:>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="fastText model (default: train one)")
    ap.add_argument("--batch", type=int, default=64, help="documents per turn")
    ap.add_argument("--limit", type=int, default=None, help="first N documents only")
    args = ap.parse_args()
    run(args.model, args.batch, args.limit)


if __name__ == "__main__":
    main()
