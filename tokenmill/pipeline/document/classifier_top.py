"""The classifier's ``top_fraction``: a global stage keeping, per source, the best-scored
share of the documents the earlier stages kept (the classifier document stage scores them,
``metadata["classifier_score"]``; DCLM, Li et al. 2024, keeps its top 10 % so).

The decision (one task on the driver): per source, the documents not removed by an earlier
global stage, ordered by score (highest first), ties by key; the first
``ceil(top_fraction * n)`` are kept, the others removed (quarantine ``stage="classifier_top"``,
``reason="classifier_top:removed"``, ``detail`` the score). Memory: a score and a
key per document on the driver (about 100 bytes a document). The output is
content-addressed by the blocks, the earlier removals and the stage's fingerprint, so a rerun
reuses it; it does not depend on the number of workers or on ``parts``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.run.intermediate import StageOutput, content_hash
from tokenmill.pipeline.run.partition_files import cached, write_partitioned
from tokenmill.pipeline.run.prepare_task import block_column_names, read_block_columns
from tokenmill.pipeline.run.removals import REMOVALS, Shuffle, removal_file
from tokenmill.pipeline.stage import Document, GlobalContext, GlobalDecision, GlobalStage

VERSION = 1


class ClassifierTopFraction(GlobalStage):
    """Keep the ``top_fraction`` best-scored documents of each source (module docstring).

    Args:
        top_fraction: share kept, in (0, 1].
    """

    name = "classifier_top"
    version = 1
    columns = ("top_score",)

    def __init__(self, top_fraction: float) -> None:
        if not 0.0 < top_fraction <= 1.0:
            raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
        super().__init__(top_fraction=top_fraction)
        self.top_fraction = top_fraction

    def block_columns(self, docs: list[Document]) -> dict[str, Any]:
        """``top_score``: float32 classifier score per document (0 when unscored)."""
        return {"top_score": pa.array([float(d.metadata.get("classifier_score", 0.0))
                                       for d in docs], pa.float32())}

    def decide(self, ctx: GlobalContext) -> GlobalDecision:
        run = Shuffle.of(ctx)
        digest = content_hash("classifier_top", VERSION, self.fingerprint(), ctx.blocks,
                              run.earlier)
        out = StageOutput(run.work, "classifier_top", digest)
        cached(out, lambda: self._compute(ctx, run, out))
        # no manifest record of its own: the per-source counts say what it removed
        return GlobalDecision(run.earlier + (removal_file("classifier_top", digest),))

    def _compute(self, ctx: GlobalContext, run: Shuffle, out: StageOutput) -> dict[str, Any]:
        by_source: dict[str, list[tuple[float, str, int, int]]] = {}
        for b, d in enumerate(ctx.blocks):
            if "top_score" not in block_column_names(run.prepare_work, d):
                continue  # a source the classifier does not score: it keeps every document
            t = read_block_columns(run.prepare_work, d, ["key", "top_score"])
            gone = set(run.removed_rows(b).tolist())
            for row, (key, score) in enumerate(zip(t.column("key").to_pylist(),
                                                   t.column("top_score").to_pylist(),
                                                   strict=True)):
                if row not in gone:
                    by_source.setdefault(key.split("/", 1)[0], []).append(
                        (-score, key, b, row))
        removed: list[tuple[float, str, int, int]] = []
        for docs in by_source.values():
            docs.sort()
            removed += docs[math.ceil(self.top_fraction * len(docs)):]
        removed.sort(key=lambda r: (r[2], r[3]))
        table = pa.table({"block": pa.array([r[2] for r in removed], pa.int32()),
                          "row": pa.array([r[3] for r in removed], pa.int32()),
                          "key": [r[1] for r in removed],
                          "kept": pa.nulls(len(removed), pa.string()),
                          "stage": [self.name] * len(removed),
                          "detail": [f"{-r[0]:.4f}" for r in removed]}, schema=REMOVALS)
        out.dir.mkdir(parents=True, exist_ok=True)
        write_partitioned(out.path(".arrow"), table,
                          np.array([r[2] for r in removed], np.int64), len(ctx.blocks))
        return {"removed": len(removed)}
