"""Where a run's time goes: CPU seconds, documents and bytes per stage, summed over the
tasks that computed them, and the wall time of each phase (after datatrove's per-step
stats). Written to ``stats.json`` beside the manifest (:data:`STATS_NAME`); the manifest
itself holds no time, so that it stays byte-identical across runs.

CPU time is the worker process's (``time.process_time``: every thread of the task, e.g.
tiktoken's encoding pool), measured inside the Ray tasks around each stage's work on a
block, including the writing of the stage's intermediate output. A block whose output an
earlier run left is counted as reused, with no time. Rates are per CPU second, that is
per core: ``documents / cpu_seconds`` and ``bytes / 1e6 / cpu_seconds``.

Bytes are the UTF-8 bytes of the documents' text entering the stage (as read, before
normalization changes it); for ``read``, the text it yields.

Rows are the stages of :data:`~tokenmill.pipeline.run.stage_list.STAGES` that ran, in
order, and two rows of the executor's own work: ``prepare`` (storing each block's
surviving documents and the global stages' columns, after the document stages, and
loading the outputs of reused stages) and
``removals`` (gathering each block's removals after the global decisions).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenmill.atomic import atomic_write_text

STATS_NAME = "stats.json"
#: rows that are the executor's work, not a stage's, and the stage each follows
OVERHEAD_AFTER = {"prepare": "document", "removals": "global"}


def utf8_size(text: str) -> int:
    """UTF-8 bytes of ``text`` (lone surrogates as 3 bytes); no copy for ASCII text
    (``str.isascii`` reads a flag)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass
class StageTime:
    """One stage's work in a run.

    Attributes:
        cpu_seconds: CPU time of the tasks' work for the stage, summed.
        documents: documents entering the stage in the blocks it computed.
        bytes: UTF-8 bytes of their text.
        blocks: blocks (or sources, or decisions) it computed.
        reused: blocks whose output an earlier run left (not timed).
    """

    cpu_seconds: float = 0.0
    documents: int = 0
    bytes: int = 0
    blocks: int = 0
    reused: int = 0

    def add(self, cpu_seconds: float, documents: int = 0, nbytes: int = 0,
            blocks: int = 1) -> None:
        self.cpu_seconds += cpu_seconds
        self.documents += documents
        self.bytes += nbytes
        self.blocks += blocks

    def rates(self) -> tuple[float | None, float | None]:
        """(documents per CPU second, MB (1e6 bytes) per CPU second), None without time
        (MB/s: or without bytes)."""
        if self.cpu_seconds <= 0:
            return None, None
        return (self.documents / self.cpu_seconds,
                self.bytes / 1e6 / self.cpu_seconds if self.bytes else None)


def row_order() -> list[str]:
    """Stage names in pipeline order, with the overhead rows after their scope's stages."""
    from tokenmill.pipeline.run import stage_list  # the stage list imports the tasks

    names: list[str] = []
    stages = stage_list.STAGES
    for i, s in enumerate(stages):
        names.append(s.name)
        nxt = stages[i + 1].scope if i + 1 < len(stages) else None
        names += [row for row, scope in OVERHEAD_AFTER.items()
                  if s.scope == scope and nxt != scope]
    return names


@dataclass
class RunStats:
    """A run's :class:`StageTime` per row name, the wall seconds of its phases, its wall
    time, the CPUs of its Ray cluster, and its units prepared while Ray started (by the
    :class:`~tokenmill.pipeline.run.startup_worker.StartupWorker`) of all its units."""

    stages: dict[str, StageTime]
    phases: dict[str, float]
    wall_seconds: float = 0.0
    cpus: int = 1
    startup_units: int = 0
    units: int = 0

    @classmethod
    def empty(cls) -> RunStats:
        return cls({}, {})

    def row(self, name: str) -> StageTime:
        return self.stages.setdefault(name, StageTime())

    def merge(self, timings: dict[str, list[float]]) -> None:
        """Add a task's ``{row: [cpu_seconds, documents, bytes]}`` (one block each)."""
        for name, (cpu, docs, nbytes) in timings.items():
            self.row(name).add(cpu, int(docs), int(nbytes))

    @property
    def cpu_seconds(self) -> float:
        return sum(t.cpu_seconds for t in self.stages.values())

    def busy_share(self) -> float:
        """CPU seconds of the stages over the CPU seconds the cluster had (wall × CPUs)."""
        have = self.wall_seconds * self.cpus
        return self.cpu_seconds / have if have > 0 else 0.0

    def ordered(self) -> list[tuple[str, StageTime]]:
        order = row_order()
        return sorted(self.stages.items(),
                      key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order),
                                      kv[0]))

    def to_json(self) -> dict[str, Any]:
        rows = []
        for name, t in self.ordered():
            docs_s, mb_s = t.rates()
            rows.append({"stage": name, **asdict(t), "cpu_seconds": round(t.cpu_seconds, 4),
                         "share": round(t.cpu_seconds / self.cpu_seconds, 4)
                         if self.cpu_seconds else 0.0,
                         "documents_per_second": None if docs_s is None else round(docs_s, 1),
                         "mb_per_second": None if mb_s is None else round(mb_s, 3)})
        return {"wall_seconds": round(self.wall_seconds, 3), "cpus": self.cpus,
                "cpu_seconds": round(self.cpu_seconds, 3),
                "busy_share": round(self.busy_share(), 4),
                "units": self.units, "startup_units": self.startup_units,
                "phases": {k: round(v, 3) for k, v in self.phases.items()}, "stages": rows}

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write ``stats.json`` into ``out_dir`` (atomically); returns its path."""
        path = Path(out_dir) / STATS_NAME
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path


def load_stats(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The ``stats.json`` of a run's output folder (:meth:`RunStats.to_json`), or None
    when it is missing or unreadable."""
    try:
        return json.loads((Path(out_dir) / STATS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def stats_table(stats: RunStats) -> str:
    """The summary's time-per-stage table: per row blocks computed and reused, documents,
    MB, CPU seconds and share, documents/s and MB/s per core; then the wall time, the
    share of the CPUs busy and the phases' wall seconds."""
    rows = [("stage", "blocks", "reused", "documents", "MB", "CPU s", "share", "docs/s/core",
             "MB/s/core")]
    total = stats.cpu_seconds
    for name, t in stats.ordered():
        docs_s, mb_s = t.rates()
        rows.append((name, str(t.blocks), str(t.reused), f"{t.documents:,}",
                     f"{t.bytes / 1e6:,.1f}", f"{t.cpu_seconds:.2f}",
                     f"{t.cpu_seconds / total:.0%}" if total else "-",
                     _num(docs_s, ",.0f"), _num(mb_s, ".1f")))
    rows.append(("TOTAL", "", "", "", "", f"{total:.2f}", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["time per stage (CPU seconds summed over the tasks; rates per core):"]
    for j, r in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths, strict=True))))
        if j in (0, len(rows) - 2):
            lines.append("  ".join("-" * w for w in widths))
    phases = ", ".join(f"{k} {v:.1f}" for k, v in stats.phases.items())
    lines.append(f"wall {stats.wall_seconds:.1f} s on {stats.cpus} CPUs, "
                 f"{stats.busy_share():.0%} of them busy in stages; phases (wall s): {phases}")
    if stats.startup_units:
        lines.append(f"{stats.startup_units} of {stats.units} units prepared while Ray started")
    return "\n".join(lines)
