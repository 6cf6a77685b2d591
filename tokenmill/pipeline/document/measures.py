"""The measure behind each filter rule, as fixed-bin histograms, to tune thresholds by.

A quality filter checks its rules in order and stops at the first that removes the
document; each rule's measure (a ratio, a count) is recorded as it is computed, so a
rule's histogram holds exactly the documents that reached it. The bins are fixed per
rule (:data:`RULES`), so histograms of any blocks add up::

    stage = build_quality_filter("fineweb")
    kept = list(stage(docs))
    hist = stage.measures.histograms()   # {"fineweb:line_punct_ratio": [counts], ...}
    total = merge([hist_block_1, hist_block_2])

Recording costs one list append per rule reached; the binning is one ``np.histogram``
per rule per block. Values outside a rule's range are counted in its first or last bin.
The thresholds drawn are the rule's defaults unless the stage's config overrides them
(:func:`thresholds`).

What a run keeps per block (:func:`block_record`) is one small JSON object: ``source``,
``block`` and ``histograms`` (``{stage: {rule: [counts]}}``); :func:`read_records`
merges a folder of them per source.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokenmill.atomic import atomic_write_text


@dataclass(frozen=True)
class Rule:
    """One rule's histogram: the measure's name and unit, its range and bins (``log``:
    log-spaced, the range's low end > 0), the config key(s) of its threshold(s) and
    whether documents go above (``"max"``) or below (``"min"``) it."""

    label: str
    lo: float
    hi: float
    bins: int
    keys: tuple[str, ...]
    removes: str  # "min": below the threshold goes, "max": above goes, "range": both
    log: bool = False

    def edges(self) -> np.ndarray:
        """float64[bins + 1] bin edges."""
        if self.log:
            return np.logspace(np.log10(self.lo), np.log10(self.hi), self.bins + 1)
        return np.linspace(self.lo, self.hi, self.bins + 1)


def _frac(label: str, key: str, removes: str = "max", hi: float = 1.0) -> Rule:
    return Rule(label, 0.0, hi, 50, (key,), removes)


RULES: dict[str, Rule] = {
    "gopher_quality:word_count": Rule("non-symbol words", 1, 1e6, 60,
                                      ("min_doc_words", "max_doc_words"), "range", log=True),
    "gopher_quality:mean_word_length": Rule(
        "mean word length (characters)", 0, 20, 80,
        ("min_avg_word_length", "max_avg_word_length"), "range"),
    "gopher_quality:symbol_ratio": _frac("# or ellipses per word", "max_symbol_word_ratio",
                                         hi=0.5),
    "gopher_quality:bullet_lines": _frac("share of lines starting with a bullet",
                                         "max_bullet_lines_ratio"),
    "gopher_quality:ellipsis_lines": _frac("share of lines ending in an ellipsis",
                                           "max_ellipsis_lines_ratio"),
    "gopher_quality:alpha_ratio": _frac("share of words holding a letter",
                                        "min_alpha_words_ratio", "min"),
    "gopher_quality:stop_words": Rule("distinct stop words", -0.5, 8.5, 9, ("min_stop_words",),
                                      "min"),
    "gopher_repetition:dup_para_frac": _frac("duplicate paragraphs (share)", "dup_para_frac",
                                             hi=0.6),
    "gopher_repetition:dup_para_char_frac": _frac("characters in duplicate paragraphs",
                                                  "dup_para_char_frac", hi=0.6),
    "gopher_repetition:dup_line_frac": _frac("duplicate lines (share)", "dup_line_frac",
                                             hi=0.6),
    "gopher_repetition:dup_line_char_frac": _frac("characters in duplicate lines",
                                                  "dup_line_char_frac", hi=0.6),
    "gopher_repetition:top_n_gram": _frac("characters in the top 2-gram", "top_n_grams",
                                          hi=0.6),
    "gopher_repetition:dup_n_gram": _frac("characters in duplicated 5-grams", "dup_n_grams",
                                          hi=0.6),
    "c4:too_few_sentences": Rule("sentences in kept lines", -0.5, 49.5, 50,
                                 ("min_num_sentences",), "min"),
    "fineweb:line_punct_ratio": _frac("share of lines ending in a sentence terminal",
                                      "line_punct_thr", "min"),
    "fineweb:short_line_ratio": _frac("share of short lines", "short_line_thr"),
    "fineweb:char_dup_ratio": _frac("characters in duplicate lines", "char_duplicates_ratio",
                                    hi=0.2),
    "fineweb:list_ratio": _frac("newlines per word", "new_line_ratio", hi=1.5),
    "language:low_score": _frac("top language's probability", "min_score", "min"),
}


def thresholds(rule: str, config: dict[str, Any]) -> list[float]:
    """The threshold(s) of ``rule`` in a stage's ``config`` (its constructor keyword
    arguments; n-gram rules: the first n's fraction); missing or ``None`` ones left out."""
    out = []
    for key in RULES[rule].keys:
        v = config.get(key)
        if isinstance(v, list | tuple):
            v = v[0][1] if v else None
        if v is not None and v != -1:
            out.append(float(v))
    return out


class Measures:
    """Per-rule measures recorded by one stage object (one block)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def record(self, rule: str, value: float) -> None:
        """Add one document's measure for ``rule`` (a key of :data:`RULES`)."""
        try:
            self.values[rule].append(value)
        except KeyError:
            self.values[rule] = [value]

    def histograms(self) -> dict[str, list[int]]:
        """``{rule: counts}`` (``RULES[rule].bins`` int counts), rules in sorted order."""
        out = {}
        for rule in sorted(self.values):
            spec = RULES[rule]
            v = np.clip(np.asarray(self.values[rule], np.float64), spec.lo, spec.hi)
            out[rule] = np.histogram(v, spec.edges())[0].astype(int).tolist()
        return out


def merge(hists: Iterable[dict[str, list[int]]]) -> dict[str, list[int]]:
    """The sum, rule by rule, of histograms of the same rules' fixed bins."""
    out: dict[str, list[int]] = {}
    for h in hists:
        for rule, counts in h.items():
            prev = out.get(rule)
            out[rule] = list(counts) if prev is None else [a + b for a, b in
                                                           zip(prev, counts, strict=True)]
    return dict(sorted(out.items()))


def block_record(source: str, block: int, stages: Iterable[Any]) -> dict[str, Any]:
    """The JSON-able record of one block: ``{"source", "block", "histograms": {stage
    name: {rule: counts}}, "thresholds": {rule: [values]}}`` over the stage objects that
    have ``measures`` (the others are skipped)."""
    hists, thr = {}, {}
    for st in stages:
        m = getattr(st, "measures", None)
        if isinstance(m, Measures) and m.values:
            hists[st.name] = m.histograms()
            thr.update({r: thresholds(r, st.config) for r in hists[st.name]})
    return {"source": source, "block": block, "histograms": hists,
            "thresholds": dict(sorted(thr.items()))}


def read_records(folder: str | Path) -> dict[str, dict[str, Any]]:
    """``{source: {"histograms": {rule: counts}, "thresholds": {rule: [values]}}}``
    merged over the ``*.json`` block records under ``folder`` (none: ``{}``)."""
    per: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(Path(folder).rglob("*.json")):
        rec = json.loads(p.read_text(encoding="utf-8"))
        per.setdefault(rec["source"], []).append(rec)
    out = {}
    for src, recs in sorted(per.items()):
        hists = merge(h for r in recs for h in r["histograms"].values())
        thr: dict[str, list[float]] = {}
        for r in recs:
            thr.update(r.get("thresholds", {}))
        out[src] = {"histograms": hists, "thresholds": thr}
    return out


def write_records(folder: str | Path, per_source: dict[str, list[dict[str, Any]]]) -> None:
    """Write one record per source under ``folder`` (``SOURCE.json``, atomic), merged over
    ``per_source[source]``: the per-stage ``info`` dicts of its blocks, whose ``measures``
    (``{"histograms", "thresholds"}``) the stages left; records of other sources there are
    removed, so the folder always describes the last run."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keep = set()
    for source, infos in per_source.items():
        hists: dict[str, list[dict[str, list[int]]]] = {}
        thr: dict[str, list[float]] = {}
        for info in infos:
            for name, st in info.items():
                m = st.get("measures") if isinstance(st, dict) else None
                if m:
                    hists.setdefault(name, []).append(m["histograms"])
                    thr.update(m["thresholds"])
        rec = {"source": source, "block": -1,
               "histograms": {n: merge(h) for n, h in sorted(hists.items())},
               "thresholds": dict(sorted(thr.items()))}
        path = folder / f"{len(keep):04d}.json"
        keep.add(path.name)
        atomic_write_text(path, json.dumps(rec, sort_keys=True))
    for p in folder.glob("*.json"):
        if p.name not in keep:
            p.unlink()
