"""The quarantine rows of a stage that cuts repeated spans out of documents (substring
and span dedup): a removal row when what the cuts leave is too short, else one edit row
per cut, written per block as the removal phase reads them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from tokenmill.pipeline.run.intermediate import StageOutput
from tokenmill.pipeline.run.partition_files import write_partitioned
from tokenmill.pipeline.run.removals import EDITS, REMOVALS


class CutRows:
    """Removal and edit rows of one cutting task, in the :data:`REMOVALS` and
    :data:`EDITS` schemas.

    Args:
        stage: the stage's name, written in every row.
    """

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.removals: list[dict[str, Any]] = []
        self.edits: list[dict[str, Any]] = []

    def remove(self, where: tuple[int, int], key: str, why: str, cuts: int,
               unit: str = "") -> None:
        """Row ``where`` (block, row) removed whole: ``why`` (the length rule's reason)
        after cutting ``cuts`` repeated spans (of ``unit``s, e.g. ``sentence``)."""
        spans = f"{unit} spans" if unit else "spans"
        self.removals.append({"block": where[0], "row": where[1], "key": key, "kept": None,
                              "stage": self.stage,
                              "detail": f"{why} after cutting {cuts} repeated {spans}"})

    def edit(self, where: tuple[int, int], key: str, reason: str,
             cuts: Iterable[tuple[int, int, int, int]]) -> None:
        """Row ``where`` kept with ``cuts`` (character start and end, token start and
        end, -1 when not known) cut out, each an edit row of ``reason``."""
        self.edits += [{"block": where[0], "row": where[1], "key": key, "stage": self.stage,
                        "reason": reason, "start": s, "end": e, "token_start": t0,
                        "token_end": t1} for s, e, t0, t1 in cuts]

    def write(self, out: StageOutput, n_blocks: int) -> None:
        """Write ``out``'s ``.removals.arrow`` and ``.edits.arrow``, partitioned by
        block (``n_blocks`` parts)."""
        for name, rows, schema in (("removals", self.removals, REMOVALS),
                                   ("edits", self.edits, EDITS)):
            t = pa.Table.from_pylist(rows, schema=schema)
            write_partitioned(out.path(f".{name}.arrow"), t,
                              np.asarray(t.column("block").to_numpy(), np.int64), n_blocks)
