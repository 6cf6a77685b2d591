"""Draw docs/pipeline.svg: the curation stages, what `tokenmill run` writes, and the commands
that read its outputs.

    python docs/make_pipeline_figure.py     # rewrites docs/pipeline.svg (text kept as text)

The drawing is deterministic (fixed SVG ids, no date), so a rerun gives the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

TARGET = Path(__file__).resolve().parent / "pipeline.svg"

#: Per-document stages, then the global (cross-document) ones, in the order they run.
STAGES = [("read", "jsonl, parquet, zst, txt"), ("license", "source and per-document"),
          ("normalize", "NFC, controls"), ("length", "chars, words"),
          ("quality", "Gopher, C4, FineWeb"), ("language", "fastText lid.176"),
          ("exact dedup", "content hash"), ("fuzzy dedup", "MinHash-LSH + Jaccard"),
          ("tokenize", "tiktoken, EOT"), ("shards", "train / val")]
#: What `tokenmill run` writes under OUT/.
OUTPUTS = [("shards/SOURCE/*.bin", "tokens, 256 x int32 header"),
           ("shards/SOURCE/*.docs.parquet", "per document: offset, tokens, key"),
           ("quarantine/SOURCE.parquet", "every removed row, stage, reason"),
           ("manifest.json", "config, counts, files, sha256"),
           ("report.html + PNGs", "plots, removed samples"),
           ("text/ (--write-text)", "Hub-layout parquet dataset"),
           ("work/", "content-addressed intermediates")]
#: Commands that read the outputs, and what they write.
AFTER = [("mix build SPEC", "mix.json (training mix)"),
         ("shards export", "fineweb_{train,val}_*.bin"),
         ("legality build", "TOKENIZER.legality"),
         ("ngram build", "suffix-array index"),
         ("ngram lem / features", "side channels"),
         ("train CONFIG", "checkpoints, metrics"),
         ("report OUT", "report.html again")]

STAGE_COLOR, GLOBAL_COLOR, OUT_COLOR, AFTER_COLOR = "#dbe9f6", "#fde2c8", "#e3f1dc", "#ece4f3"


def box(ax, x: float, y: float, w: float, h: float, title: str, sub: str, color: str) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="#555555", lw=0.8))
    ax.text(x + w / 2, y + h * 0.63, title, ha="center", va="center", fontsize=8.5,
            weight="bold")
    ax.text(x + w / 2, y + h * 0.28, sub, ha="center", va="center", fontsize=7, color="#333")


def arrow(ax, x0: float, y0: float, x1: float, y1: float) -> None:
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.8))


def draw() -> plt.Figure:
    fig, ax = plt.subplots(figsize=(11, 5.6))
    ax.set_xlim(0, 11)
    ax.set_ylim(-0.4, 5.2)
    ax.axis("off")
    ax.text(0.1, 5.0, "tokenmill run DATAMIX  (Ray tasks; per-document stages in blue, "
            "cross-document stages in orange)", fontsize=9.5, weight="bold", va="center")
    w, h, step = 2.0, 0.62, 2.18
    for i, (title, sub) in enumerate(STAGES):
        row, col = divmod(i, 5)
        col = col if row == 0 else 4 - col  # the second row runs right to left
        x, y = 0.3 + col * step, 4.05 - row * 1.0
        color = GLOBAL_COLOR if title in ("exact dedup", "fuzzy dedup", "shards") else STAGE_COLOR
        box(ax, x, y, w, h, title, sub, color)
        if i % 5 < 4:
            x0, x1 = (x + w, x + step) if row == 0 else (x, x + w - step)
            arrow(ax, x0, y + h / 2, x1, y + h / 2)
    arrow(ax, 0.3 + 4 * step + w / 2, 4.05, 0.3 + 4 * step + w / 2, 3.05 + h)  # row 1 -> 2
    arrow(ax, 0.3 + w / 2, 3.05, 0.3 + w / 2, 2.45)  # shards -> OUT/
    ax.text(1.45, 2.62, "OUT/  (default out/NAME)", fontsize=9.5, weight="bold", va="center")
    ax.text(5.7, 2.55, "then", fontsize=9.5, weight="bold", va="center")
    for i, (title, sub) in enumerate(OUTPUTS):
        box(ax, 0.3, 2.05 - i * 0.39, 5.1, 0.34, "", "", OUT_COLOR)
        ax.text(0.4, 2.05 - i * 0.39 + 0.17, title, fontsize=8, weight="bold", va="center",
                family="monospace")
        ax.text(3.1, 2.05 - i * 0.39 + 0.17, sub, fontsize=7.5, va="center")
    for i, (title, sub) in enumerate(AFTER):
        box(ax, 5.7, 2.05 - i * 0.39, 5.0, 0.34, "", "", AFTER_COLOR)
        ax.text(5.8, 2.05 - i * 0.39 + 0.17, "tokenmill " + title, fontsize=8, weight="bold",
                va="center", family="monospace")
        ax.text(8.55, 2.05 - i * 0.39 + 0.17, "-> " + sub, fontsize=7.5, va="center")
    fig.tight_layout(pad=0.2)
    return fig


def main() -> int:
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: small and searchable
    plt.rcParams["svg.hashsalt"] = "tokenmill"
    fig = draw()
    fig.savefig(TARGET, format="svg", metadata={"Date": None})
    print(f"wrote {TARGET} ({TARGET.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
