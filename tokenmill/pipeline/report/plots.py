"""The curation report's plots, drawn from plain data (lists, dicts, numbers), so that
they can be drawn in this process or in worker processes started ahead of time.

API::

    spec = PlotSpec("mixture.png", "Mixture", "Tokens per source.", "mixture",
                    {"tokens": [10, 20], "labels": ["a", "b"]})
    render(out / spec.png, spec.kind, spec.data)            # in this process
    with PlotWorkers(2) as w:                               # started before the run
        ...                                                 # (imports, fonts loaded)
        w.submit(out / spec.png, spec).result()             # drawn in a worker

Kinds and their data (see :mod:`tokenmill.pipeline.report.curation_report` for what each shows):

==================  ===================================================================
``waterfall``       ``labels`` (columns), ``documents`` and ``tokens``: source -> values
``lengths``         ``before``, ``after``: document lengths in tokens
``removal_rates``   ``items``: ``[(label, share 0..1)]``, drawn bottom to top; optional
                    ``per_source``: source -> shares in ``items`` order (grouped bars)
``clusters``        ``per_stage``: stage -> {cluster size: clusters}, ``counts``: stage ->
                    clusters
``languages``       ``top``: ``[(language, documents)]``
``mixture``         ``tokens``, ``labels``, optional ``weights``: per source (bars of the
                    weighted shares, largest on top)
``rules``           ``rules``: per filter rule ``{"rule", "label", "edges", "log",
                    "thresholds", "removes": "min"|"max"|"range", "counts": source ->
                    histogram counts}`` (one panel each, thresholds dashed, the removing
                    side shaded)
``stage_times``     ``stages`` (names, pipeline order), ``cpu_seconds``, ``mb_per_second``
                    and ``documents_per_second`` (per core, None without time),
                    ``is_stage`` (False: the executor's own work), ``wall_seconds``,
                    ``cpus``
==================  ===================================================================

Drawing is deterministic: the same data give the same PNG bytes, in any process
(matplotlib's Agg backend, default style, ``dpi=100``, tight bounding box but
``rules``, which sets its own margins).

:class:`PlotWorkers` uses the ``forkserver`` start method with matplotlib preloaded, so
the import and font loading are paid once, while the pipeline runs, not after it.
This module imports only numpy and matplotlib (and :mod:`tokenmill.atomic`), so that a
worker starts fast.
"""

from __future__ import annotations

import io
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenmill.atomic import atomic_write_bytes


@dataclass(frozen=True)
class PlotSpec:
    """One plot of the report: its file name, HTML title and caption, kind, data."""

    png: str
    title: str
    caption: str
    kind: str
    data: dict[str, Any]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, labels: list[str], series: dict[str, list[float]], ylabel: str,
          title: str) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(labels))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x + (i - (n - 1) / 2) * width, vals, width, label=name)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def _waterfall(plt, d: dict[str, Any]):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    _bars(axes[0], d["labels"], d["documents"], "documents",
          "documents remaining after each stage")
    _bars(axes[1], d["labels"], d["tokens"], "tokens (EOT included)",
          "tokens remaining after each stage")
    return fig


def _lengths(plt, d: dict[str, Any]):
    before, after = d["before"], d["after"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    hi = max(before + after + [2])
    bins = np.logspace(0, np.log10(hi) + 0.05, 40)
    ax.hist(before, bins=bins, alpha=0.5, label=f"before ({len(before)} docs)")
    ax.hist(after, bins=bins, alpha=0.7, label=f"after ({len(after)} docs)")
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents")
    ax.set_title("document length before and after curation")
    ax.legend()
    return fig


def _removal_rates(plt, d: dict[str, Any]):
    items = d["items"]
    given = d.get("per_source") or {"all sources": [v for _, v in items]}
    color = {src: f"C{i}" for i, src in enumerate(given)}  # as in the other plots
    per_source = {src: v for src, v in given.items() if any(v)}  # something removed
    n = max(1, len(per_source))
    fig, ax = plt.subplots(figsize=(9, (0.13 * n + 0.12) * len(items) + 1.6))
    y = np.arange(len(items))
    h = 0.8 / n
    for i, (src, vals) in enumerate(per_source.items()):
        ax.barh(y + (n - 1 - 2 * i) * h / 2, [v * 100 for v in vals], h, label=src,
                color=color[src])
    ax.set_yticks(y, [k for k, _ in items])
    ax.set_ylim(-0.6, len(items) - 0.4)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("% of the stage's input documents removed (per source)")
    ax.set_title("removal rate per stage and reason")
    if n > 1:
        ax.legend(fontsize=8, loc="lower right")
    return fig


def _clusters(plt, d: dict[str, Any]):
    from matplotlib.ticker import FuncFormatter, NullFormatter

    per_stage: dict[str, dict[int, int]] = d["per_stage"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sizes = sorted(set().union(*per_stage.values()))
    _bars(ax, [str(x) for x in sizes],
          {f"{st} ({d['counts'][st]} clusters)": [c.get(x, 0) for x in sizes]
           for st, c in per_stage.items()},
          "clusters", "duplicate cluster sizes")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("cluster size (kept document + removed duplicates)")
    return fig


def _languages(plt, d: dict[str, Any]):
    top = d["top"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([k for k, _ in top], [v for _, v in top])
    ax.set_ylabel("kept documents")
    ax.set_title("language of kept documents")
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    return fig


def _mixture(plt, d: dict[str, Any]):
    tokens = d["tokens"]
    weights = d.get("weights") or [1.0] * len(tokens)
    mass = [t * w for t, w in zip(tokens, weights, strict=True)]
    total = sum(mass) or 1
    order = sorted(range(len(tokens)), key=lambda i: mass[i])
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(tokens) + 1.4))
    shares = [100 * mass[i] / total for i in order]
    ax.barh([d["labels"][i] for i in order], shares, color="#4c72b0")
    for y, i in enumerate(order):
        ax.text(shares[y], y, f" {shares[y]:.1f}%  ({tokens[i]:,} tokens × {weights[i]:g})",
                va="center", fontsize=9)
    ax.set_xlim(0, max(shares + [1]) * 1.6)
    ax.set_xlabel("% of the weighted mixture (tokens × mixture weight)")
    ax.set_title("mixture: weighted share per source")
    return fig


def _rules(plt, d: dict[str, Any]):
    """One panel per rule: the measure's histogram per source, thresholds marked."""
    rules = d["rules"]
    cols = min(3, len(rules))
    rows = (len(rules) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.1 * rows), squeeze=False)
    for ax, r in zip(axes.flat, rules, strict=False):
        edges = np.asarray(r["edges"])
        for src, counts in r["counts"].items():
            ax.stairs(counts, edges, label=f"{src} ({sum(counts):,})")
        for t in r["thresholds"]:
            ax.axvline(t, color="#c00", ls="--", lw=1.2)
        lo, hi = edges[0], edges[-1]
        for t in r["thresholds"][:1] if r["removes"] != "range" else []:
            a, b = (lo, t) if r["removes"] == "min" else (t, hi)
            ax.axvspan(a, b, color="#c00", alpha=0.08, lw=0)
        if r["removes"] == "range" and len(r["thresholds"]) == 2:
            ax.axvspan(lo, r["thresholds"][0], color="#c00", alpha=0.08, lw=0)
            ax.axvspan(r["thresholds"][1], hi, color="#c00", alpha=0.08, lw=0)
        if r.get("log"):
            ax.set_xscale("log")
        ax.set_yscale("log")  # the tails near a threshold hold few documents
        ax.set_ylim(bottom=0.7)
        ax.set_xlim(lo, hi)
        ax.set_title(r["rule"], fontsize=9)
        ax.set_xlabel(r["label"], fontsize=8)
        ax.set_ylabel("documents reaching the rule", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(rules):]:
        ax.set_visible(False)
    # fixed margins (inches), not tight_layout: each layout pass draws every panel's
    # ticks again, and with a panel per rule that was most of the report's drawing time
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=0.62 / w, right=1 - 0.12 / w, bottom=0.5 / h, top=1 - 0.3 / h,
                        wspace=0.9 / (4.4 - 0.74 / cols), hspace=0.85 / (3.1 - 0.8 / rows))
    return fig


def _stage_times(plt, d: dict[str, Any]):
    """CPU seconds per stage (pipeline order, top to bottom), labelled with the rates."""
    names, cpu, mb_s, docs_s = d["stages"], d["cpu_seconds"], d["mb_per_second"], \
        d["documents_per_second"]
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(names) + 1.6))
    y = np.arange(len(names))[::-1]
    ax.barh(y, cpu, color=["#4c72b0" if o else "#999" for o in d["is_stage"]])
    total = sum(cpu) or 1
    for yi, c, m, n in zip(y, cpu, mb_s, docs_s, strict=True):
        rate = "" if m is None else f", {m:,.1f} MB/s, {n:,.0f} docs/s per core"
        ax.text(c, yi, f" {c:.2f} s ({100 * c / total:.0f}%){rate}", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.set_xlim(0, max(cpu + [0.01]) * 1.9)
    ax.set_xlabel("CPU seconds (summed over the tasks)")
    ax.set_title(f"time per stage: {total:.1f} CPU s; wall {d['wall_seconds']:.1f} s on "
                 f"{d['cpus']} CPUs")
    return fig


#: kinds whose figure sets its own margins: saved as laid out (a tight bounding box
#: would draw the figure once more to measure it)
_FIXED_LAYOUT = frozenset({"rules"})
_DRAW: dict[str, Callable] = {"waterfall": _waterfall, "lengths": _lengths,
                              "removal_rates": _removal_rates, "clusters": _clusters,
                              "languages": _languages, "mixture": _mixture,
                              "rules": _rules, "stage_times": _stage_times}


def draw(kind: str, data: dict[str, Any]) -> bytes:
    """The PNG bytes of plot ``kind`` (a key of the kinds table above) drawn from ``data``.

    Raises:
        KeyError: an unknown kind.
    """
    plt = _pyplot()
    fig = _DRAW[kind](plt, data)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100,
                    bbox_inches=None if kind in _FIXED_LAYOUT else "tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


def render(path: str | os.PathLike, kind: str, data: dict[str, Any]) -> str:
    """Draw plot ``kind`` and write it to ``path`` atomically; returns ``str(path)``."""
    atomic_write_bytes(path, draw(kind, data))
    return str(path)


def warm_up() -> None:
    """Import pyplot and draw once off-screen (fonts, the mathtext parser, the PNG
    encoder loaded), so that the report's first plot costs only its own drawing."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.hist([1, 10, 100], bins=np.logspace(0, 2, 5), label="warm up")
    ax.set_xscale("log")
    ax.legend()
    fig.savefig(io.BytesIO(), format="png", dpi=20, bbox_inches="tight")
    plt.close(fig)


def _ready() -> int:
    return os.getpid()


def _init_worker(owner: int) -> None:
    """Worker start: :func:`warm_up`, and a daemon thread that ends this worker when
    process ``owner`` (the one that made the pool) is gone, even by SIGKILL, which
    ``ProcessPoolExecutor`` workers would otherwise outlive, blocked on their queue.
    Ctrl-C is ignored here: the terminal sends it to the whole process group, and the
    process that owns the pool answers it (one line) and stops the workers."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        try:
            fd = os.pidfd_open(owner)  # Linux >= 5.3: readable once the process is gone
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            import select

            select.select([fd], [], [])
        else:
            while True:
                try:
                    os.kill(owner, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                threading.Event().wait(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()
    warm_up()


class PlotWorkers:
    """Up to ``workers`` processes that draw plots, started on ``__enter__`` and warmed up
    (:func:`warm_up`) while the caller does other work; ``__exit__`` stops them.

    ``forkserver`` start method with matplotlib preloaded into the fork server (the import
    paid once for all workers); a worker that dies makes :meth:`submit`'s future raise
    ``BrokenProcessPool``, which the caller may answer by drawing in-process. Workers end
    themselves when the process that started them is gone (even killed by SIGKILL).
    """

    def __init__(self, workers: int = 2) -> None:
        self.workers = max(1, workers)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> PlotWorkers:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["matplotlib.pyplot", __name__])
        self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx,
                                         initializer=_init_worker, initargs=(os.getpid(),))
        for _ in range(self.workers):  # start them now, not when the report is due
            self._pool.submit(_ready)
        return self

    def submit(self, path: str | os.PathLike, spec: PlotSpec) -> Future:
        """Draw ``spec`` into ``path`` in a worker; the future's result is ``str(path)``."""
        if self._pool is None:
            raise RuntimeError("PlotWorkers used outside its `with` block")
        return self._pool.submit(render, str(path), spec.kind, spec.data)

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
