"""Curation report: ``report.html`` plus PNG plots for a finished run's output folder.

API::

    from tokenmill.pipeline.report.curation_report import write_report
    result = write_report("out/quickstart")     # -> ReportResult(html, images, skipped)

Reads only what a run leaves behind: ``manifest.json``
(:class:`~tokenmill.manifests.schema.DatamixManifest`: per source ``counts``, ``stages``,
``tokens``, ``mixture_weight``, ``shards``), the quarantine parquet files it lists
(columns ``key, source, stage, reason, text, duplicate_of, detail``; ``raw`` optional)
and the shard sidecars ``*.docs.parquet`` (``n_tokens``; ``language`` when language id
ran). Plots (matplotlib, Agg backend, drawn by :mod:`tokenmill.pipeline.report.plots`,
in this process or in :class:`~tokenmill.pipeline.report.plots.PlotWorkers` started before
the run; the HTML uses no network asset):

=====================  ==================================================================
waterfall.png          documents and tokens per source remaining after each stage
lengths.png            document length (tokens) histogram before and after curation
removal_rates.png      share of each stage's input removed, per stage, reason and source
rule_measures.png      per filter rule, its measure's histogram per source, threshold marked
                       (from the per-block records under ``work/measures/``)
duplicate_clusters.png size distribution of duplicate clusters (kept + removed twins)
languages.png          language distribution of kept documents (sidecar ``language``)
mixture.png            the mixture: weighted share per source (tokens x mixture weight)
stage_times.png        CPU seconds per stage with documents/s and MB/s per core (from
                       ``stats.json``, :mod:`tokenmill.pipeline.report.timing`)
=====================  ==================================================================

Tables: the sources (rows read, documents kept, tokens kept, validation documents,
warnings), the documents remaining after each stage (each column named by what it
counts: ``rows read``, ``after <stage>``, ``kept``), per source and eval set the
documents decontamination removed and the spans it cut, the removed documents by license
variant (the removal-rate plot groups per-document license removals by family, as
``tokenmill manifest show`` does), the run's warnings, and, for every removal reason
(license reasons by family), up to :data:`EXAMPLES_PER_REASON` example documents from
the quarantine (their first :data:`EXAMPLE_CHARS` characters, HTML-escaped), so a filter
can be judged by reading what it removed. Edited documents (kept documents that lost
spans) have a section of their own: the tokens before and after each editing stage, and
examples with the cut spans marked (:mod:`tokenmill.pipeline.report.edits`).

A plot whose input is missing (no quarantine, no ``language`` column, no duplicates) is
skipped and named in ``ReportResult.skipped`` and in the HTML. Token counts of removed
documents are measured by encoding their quarantined text with the run's tokenizer (+1
for EOT), falling back to characters / 4 when the tokenizer is not available offline;
beyond :data:`TOKEN_COUNT_BUDGET` bytes of removed text, a systematic sample is encoded
and the rest estimated from their bytes (the plots' captions say so).
"""

from __future__ import annotations

import html
import logging
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tokenmill.atomic import atomic_write_text
from tokenmill.manifests.schema import DatamixManifest, SourceCounts, load_manifest
from tokenmill.manifests.summary import license_family
from tokenmill.pipeline.report.edits import edits_html, removed_keys
from tokenmill.pipeline.report.plots import PlotSpec, PlotWorkers, render
from tokenmill.pipeline.report.timing import stage_times_spec
from tokenmill.pipeline.report.tuning import (
    collapsed_license_rows,
    removal_rates_by_source,
    rules_spec,
)
from tokenmill.pipeline.run import stage_list
from tokenmill.pipeline.stage import is_edit_reason

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"
#: example documents shown per removal reason, and the characters shown of each
EXAMPLES_PER_REASON = 5
EXAMPLE_CHARS = 300
#: UTF-8 bytes of removed text the report encodes whole to count tokens; beyond it, a
#: sample of about that many characters (see ``_count_tokens``)
TOKEN_COUNT_BUDGET = 8_000_000



def report_stage_order() -> tuple[str, ...]:
    """The pipeline's stage order (:data:`tokenmill.pipeline.run.stage_list.STAGES`, read
    when the report is written); ``"quarantine"`` stands for rows quarantined while
    reading in manifests without per-stage counters; unknown stage names go after these."""
    order = stage_list.stage_order()
    return (*order[:2], "quarantine", *order[2:])


@dataclass
class ReportResult:
    """``html``: the report file; ``images``: PNGs written; ``skipped``: plot -> why."""

    html: Path
    images: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------
def _stage_removed(counters: dict[str, Any]) -> int | None:
    """Documents a stage removed, from whichever counters it recorded."""
    if "removed" in counters and isinstance(counters["removed"], int):
        return counters["removed"]
    if isinstance(counters.get("rejected"), dict):
        return int(sum(counters["rejected"].values()))
    if "docs_in" in counters and "docs_out" in counters:
        return int(counters["docs_in"]) - int(counters["docs_out"])
    return None


def _stage_key(name: str) -> tuple[int, str]:
    order = report_stage_order()
    return (order.index(name), name) if name in order else (len(order), name)


def column_label(stage: str) -> str:
    """What a waterfall column counts: ``rows read``, ``after <stage>``, ``kept``."""
    if stage == "read":
        return "rows read"
    if stage == "kept":
        return "kept"
    return f"after {stage.replace('_', ' ')}"


def _family_prefixes() -> tuple[str, ...]:
    """Reason prefixes of the stages whose reasons are license ids shown by family (the
    stages feeding a ``SourceCounts`` field marked ``by_family``)."""
    out = []
    for st in stage_list.STAGES:
        extra = SourceCounts.model_fields[st.counts].json_schema_extra if st.counts else None
        if isinstance(extra, dict) and extra.get("by_family") and st.strip_prefix:
            out.append(st.strip_prefix)
    return tuple(out)


_FAMILY_PREFIXES = _family_prefixes()


def reason_label(stage: str, reason: str) -> str:
    """The label of a removal reason in the plots and example lists: ``stage: reason``
    (once), per-document license ids grouped by family (``license:cc-by-nc-4.0-es`` ->
    ``license: cc-by-nc``)."""
    for prefix in _FAMILY_PREFIXES:
        if reason.startswith(prefix):
            return f"{prefix.rstrip(':')}: {license_family(reason.removeprefix(prefix))}"
    return reason if reason.startswith(stage) else f"{stage}: {reason}"


def document_waterfall(manifest: DatamixManifest) -> tuple[list[str], dict[str, list[int]]]:
    """Stages (first ``"read"``, last ``"kept"``) and, per source, the documents remaining
    after each. Removals come from ``sources[].stages`` where recorded, else from
    ``counts`` (quarantine, license, exact dedup, filters); any difference left to reach
    ``counts.kept`` is shown as ``"other"``."""
    per_source: dict[str, dict[str, int]] = {}
    names: set[str] = set()
    for src in manifest.sources:
        c = src.counts
        removed: dict[str, int] = {}
        for name, counters in src.stages.items():
            if name == "read" or not isinstance(counters, dict):
                continue
            removed[name] = _stage_removed(counters) or 0  # shown even if it removed none
        if "quarantine" not in removed and "normalize" not in removed and c.quarantined:
            removed["quarantine"] = sum(c.quarantined.values())
        if "license" not in removed and c.license_rejected:
            removed["license"] = sum(c.license_rejected.values())
        if "exact_dedup" not in removed and c.exact_duplicates:
            removed["exact_dedup"] = c.exact_duplicates
        rest = c.read - c.kept - sum(removed.values())
        if rest > 0:
            removed["other"] = rest
        per_source[src.name] = removed
        names.update(removed)
    stages = ["read"] + sorted(names, key=_stage_key) + ["kept"]
    remaining: dict[str, list[int]] = {}
    for src in manifest.sources:
        left = src.counts.read
        row = [left]
        for s in stages[1:-1]:
            left -= per_source[src.name].get(s, 0)
            row.append(left)
        row.append(src.counts.kept)
        remaining[src.name] = row
    return stages, remaining


_QUARANTINE_COLUMNS = ("key", "source", "stage", "reason", "text", "raw", "duplicate_of",
                       "detail")


class ReportInputError(ValueError):
    """A file the report reads (a quarantine or sidecar parquet) that cannot be read (one
    line naming the file)."""


def _read_parquet_columns(p: Path, columns: tuple[str, ...], what: str):
    """The ``columns`` of parquet file ``p`` that it has (a ``pyarrow.Table``).

    Raises:
        ReportInputError: ``p`` is not a readable parquet file (one line naming it).
    """
    import pyarrow as pa

    try:
        f = pq.ParquetFile(p)  # (pq.read_table's first call imports pyarrow.dataset)
        names = set(f.schema_arrow.names)
        return f.read(columns=[c for c in columns if c in names])
    except (pa.ArrowException, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ReportInputError(f"{p}: unreadable {what} parquet file ({first})") from None


def _read_quarantine(out: Path, manifest: DatamixManifest):
    """The manifest's quarantine files, concatenated (only the columns the report uses),
    or None when there is none."""
    import pyarrow as pa

    tables = []
    for q in manifest.quarantine:
        p = out / q.path
        if p.is_file():
            tables.append(_read_parquet_columns(p, _QUARANTINE_COLUMNS, "quarantine"))
    if not tables:
        return None
    # one copy into single chunks here, so that every column read below is a view
    return pa.concat_tables(tables, promote_options="default").combine_chunks()


def _read_sidecars(out: Path, manifest: DatamixManifest) -> dict[str, dict[str, list]]:
    """source -> {"n_tokens": [...], "language": [...] (if present)}."""
    from tokenmill.manifests.shards import sidecar_path

    res: dict[str, dict[str, list]] = {}
    for src in manifest.sources:
        d: dict[str, list] = defaultdict(list)
        for sh in src.shards:
            p = sidecar_path(out / sh.path)
            if not p.is_file():
                continue
            t = _read_parquet_columns(p, ("n_tokens", "language"), "sidecar")
            d["n_tokens"] += t.column("n_tokens").to_pylist()
            if "language" in t.column_names:
                d["language"] += t.column("language").to_pylist()
        res[src.name] = d
    return res


def _check_tokenizer(manifest: DatamixManifest, where: Path) -> None:
    """The manifest's tokenizer against the installed one, when it can be loaded at all
    (offline without its files, the report estimates token counts instead)."""
    from tokenmill.tokenizers import check_installed

    check_installed(manifest.tokenizer, str(where))


def _token_counter(manifest: DatamixManifest, where: str = "the run's manifest"):
    from tokenmill.tokenizers import TokenizerMismatchError, load_checked

    try:
        enc = load_checked(manifest.tokenizer, where)

        def count(texts: list[str]) -> list[int]:
            return [len(t) + 1 for t in enc.encode_ordinary_batch(
                texts, num_threads=min(4, os.cpu_count() or 1))]
    except TokenizerMismatchError:
        raise  # another tokenizer than the run's: its counts would be wrong, not estimated
    except Exception:  # tokenizer not available offline: estimate
        def count(texts: list[str]) -> list[int]:
            return [len(t) // 4 + 1 for t in texts]
    return count


def _decoder(manifest: DatamixManifest):
    """Token ids -> text with the run's tokenizer, or None when it cannot be loaded."""
    from tokenmill.tokenizers import TokenizerMismatchError, load_checked

    try:
        return load_checked(manifest.tokenizer, "the run's manifest").decode
    except TokenizerMismatchError:
        raise
    except Exception:  # not available offline: the edited examples are left out
        return None


@dataclass
class _Report:
    """What the plots of one report share."""

    out: Path
    manifest: DatamixManifest
    result: ReportResult
    q_rows: list[dict[str, Any]]  # quarantine rows (no text) with their n_tokens
    examples: dict[str, _Examples]  # reason label -> its removed documents' examples
    sidecars: dict[str, dict[str, list]]
    stages: list[str]
    remaining: dict[str, list[int]]
    token_note: str = ""  # how the removed documents' tokens were counted, when sampled
    edited: list[str] = field(default_factory=list)  # HTML of the edited documents' section
    sections: list[tuple[str, str, str]] = field(default_factory=list)  # title, png, caption

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.manifest.sources]


@dataclass
class _Examples:
    """The removed documents of one reason: how many, and the first few."""

    count: int = 0
    shown: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any], text: str | None, raw: bytes | None) -> None:
        self.count += 1
        if len(self.shown) < EXAMPLES_PER_REASON:
            self.shown.append(row | {"excerpt": _excerpt(text, raw)})


def _excerpt(text: str | None, raw: bytes | None) -> str:
    """The first :data:`EXAMPLE_CHARS` characters of a removed document (its raw bytes,
    undecodable ones as ``\\xNN``, when it has no text)."""
    if text is None and raw is not None:
        text = raw[:EXAMPLE_CHARS * 4].decode("utf-8", "backslashreplace")
    text = text or ""
    return text[:EXAMPLE_CHARS] + ("…" if len(text) > EXAMPLE_CHARS else "")


def _quarantine_rows(quarantine) -> tuple[list[dict[str, Any]], dict[str, _Examples]]:
    """Removed documents (quarantine rows without text/raw; ``n_tokens`` is added by
    :func:`_count_tokens`) and per reason label (:func:`reason_label`) the first
    examples, in quarantine order (the manifest's sources in order, keys in order
    within each)."""
    if quarantine is None or not quarantine.num_rows:
        return [], {}
    cols = {c: quarantine.column(c).to_pylist() for c in quarantine.column_names
            if c not in ("text", "raw")}
    texts = _column(quarantine, "text")
    raws = _column(quarantine, "raw")
    rows = []
    examples: dict[str, _Examples] = {}
    removed = removed_keys(quarantine)
    for i in range(quarantine.num_rows):
        row = {c: cols[c][i] for c in cols}
        if is_edit_reason(row.get("reason") or ""):
            if row["key"] in removed:
                continue  # kept to rebuild a removed document, shown as its removal
        else:
            rows.append(row)  # an edit record is an example, not a removed document
        label = reason_label(row.get("stage") or "other", row.get("reason") or "")
        ex = examples.setdefault(label, _Examples())
        if len(ex.shown) < EXAMPLES_PER_REASON:
            ex.add(row, texts[i].as_py(), raws[i].as_py())
        else:
            ex.count += 1
    order = {lab: _stage_key(lab.split(":")[0]) for lab in examples}
    return rows, dict(sorted(examples.items(), key=lambda kv: (order[kv[0]], kv[0])))


def _column(table, name: str):
    """A column as an Arrow array (all nulls when the table lacks it); a view when the
    column is one chunk (:func:`_read_quarantine` combines them)."""
    import pyarrow as pa

    if name not in table.column_names:
        return pa.nulls(table.num_rows)
    col = table.column(name)
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _count_tokens(rows: list[dict[str, Any]], quarantine, manifest: DatamixManifest,
                  budget: int | None = None) -> str:
    """Set ``n_tokens`` of every quarantine row: its text encoded with the run's tokenizer
    + 1 (EOT), or raw bytes / 4 + 1 for a row without text.

    When the removed text exceeds ``budget`` UTF-8 bytes (default
    :data:`TOKEN_COUNT_BUDGET`), a systematic sample is encoded instead: every ``s``-th
    row of each (source, stage), ``s = ceil(text bytes / budget)``, each cut to its first
    ``max(256, budget // sampled rows)`` characters, so that at most that many characters
    per sampled row are encoded, whatever the sizes. A sampled row encoded whole is exact;
    every other row gets its bytes times its (source, stage)'s sampled tokens per byte, + 1.
    Encoding everything took 20 of the report's 27 s on the 233 MB ``bench_pipeline`` run.

    Returns:
        ``""`` when every count is exact, else one sentence saying how many were encoded.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not rows:
        return ""
    text = _column(quarantine, "text")
    nbytes = _byte_lengths(text)
    has_text = pc.is_valid(text).to_numpy(zero_copy_only=False)
    total = int(nbytes[has_text].sum())
    budget = TOKEN_COUNT_BUDGET if budget is None else budget
    groups = [(r.get("source"), r.get("stage")) for r in rows]
    stride = max(1, -(-total // max(budget, 1)))
    sample = _systematic_sample(groups, has_text, stride).tolist()
    # typed indices: an empty sample (no quarantined row has text) must not infer `null`
    texts = [t or "" for t in text.take(pa.array(sample, pa.int64())).to_pylist()]
    cap = max(256, budget // max(1, len(sample))) if stride > 1 else None
    pieces = [t if cap is None or len(t) <= cap else t[:cap] for t in texts]
    counts = _token_counter(manifest)(pieces)
    exact = {i: n for i, t, piece, n in zip(sample, texts, pieces, counts, strict=True)
             if piece is t}
    piece_bytes = [int(nbytes[i]) if i in exact else len(piece.encode("utf-8", "replace"))
                   for i, piece in zip(sample, pieces, strict=True)]
    rate = _tokens_per_byte([groups[i] for i in sample], counts, piece_bytes)
    raw_bytes = _byte_lengths(_column(quarantine, "raw"))
    for i, row in enumerate(rows):
        if not has_text[i]:
            row["n_tokens"] = int(raw_bytes[i]) // 4 + 1
        elif i in exact:
            row["n_tokens"] = exact[i]
        else:
            row["n_tokens"] = round(float(nbytes[i]) * rate[groups[i]]) + 1
    if stride == 1:
        return ""
    return (f"Tokens of removed documents: {len(exact):,} of {int(has_text.sum()):,} "
            f"encoded (1 in {stride} of each source and stage, up to {cap:,} characters "
            "each); the rest are their UTF-8 bytes times the sample's tokens per byte.")


def _byte_lengths(values):
    """int64[n]: the byte length of each string/binary value (0 for null)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(values.type):
        return np.zeros(len(values), dtype=np.int64)
    return pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)


def _systematic_sample(groups: list[tuple], has_text, stride: int):
    """Row indices (int64, ascending) of every ``stride``-th row with text of each group,
    the group's first included."""
    import numpy as np

    seen: Counter = Counter()
    picked = []
    for i, g in enumerate(groups):
        if has_text[i]:
            if seen[g] % stride == 0:
                picked.append(i)
            seen[g] += 1
    return np.asarray(picked, dtype=np.int64)


def _tokens_per_byte(groups: list[tuple], counts: list[int], nbytes: list[int]) -> dict:
    """group -> tokens per UTF-8 byte of its encoded texts (each ``counts`` includes the
    EOT, excluded here); groups with no encoded byte take the overall rate (0.25 when
    nothing was encoded)."""
    tok: Counter = Counter()
    byt: Counter = Counter()
    for g, n, b in zip(groups, counts, nbytes, strict=True):
        tok[g] += n - 1
        byt[g] += b
    overall = sum(tok.values()) / sum(byt.values()) if sum(byt.values()) else 0.25
    return defaultdict(lambda: overall, {g: tok[g] / byt[g] for g in byt if byt[g]})


def _note(r: _Report) -> str:
    """The token-count note, as a sentence to append to a caption ("" when exact)."""
    return " " + r.token_note if r.token_note else ""


def _spec_waterfall(r: _Report) -> PlotSpec | None:
    stages = r.stages
    tok_removed: dict[str, Counter] = defaultdict(Counter)
    for q in r.q_rows:
        st = q.get("stage") or "other"
        if st not in stages[1:-1]:  # e.g. rows quarantined while reading
            st = "quarantine" if "quarantine" in stages else "other"
        tok_removed[q.get("source")][st] += q["n_tokens"]
    tok_series: dict[str, list[float]] = {}
    for src in r.manifest.sources:
        kept = sum(src.tokens.values())
        removed = tok_removed[src.name]
        # remaining after stage i = kept + tokens removed by the stages after it
        tok_series[src.name] = [kept + sum(removed.get(s, 0) for s in stages[i + 1:-1])
                                for i in range(len(stages) - 1)] + [kept]
    return PlotSpec("waterfall.png", "Documents and tokens per stage",
                    "Remaining after each stage, per source. Tokens of removed documents "
                    "are measured on their quarantined text." + _note(r), "waterfall",
                    {"labels": [column_label(st) for st in stages],
                     "documents": r.remaining, "tokens": tok_series})


def _spec_lengths(r: _Report) -> PlotSpec | None:
    after = [n for s in r.names for n in r.sidecars.get(s, {}).get("n_tokens", [])]
    before = after + [q["n_tokens"] for q in r.q_rows]
    if not (after or before):
        r.result.skipped["lengths.png"] = "no sidecar and no quarantine rows"
        return None
    return PlotSpec("lengths.png", "Document lengths",
                    "Before = kept documents plus every quarantined document."
                    + _note(r), "lengths",
                    {"before": before, "after": after})


def _removal_rates(r: _Report) -> dict[str, float]:
    rates: dict[str, float] = {}
    for s_i, s in enumerate(r.stages[1:-1], start=1):
        n_in = sum(r.remaining[n][s_i - 1] for n in r.names)
        reasons: Counter = Counter()
        for src in r.manifest.sources:
            counters = src.stages.get(s, {})
            if isinstance(counters, dict) and isinstance(counters.get("rejected"), dict):
                reasons.update(counters["rejected"])
            else:
                reasons[s] += r.remaining[src.name][s_i - 1] - r.remaining[src.name][s_i]
        for reason, v in reasons.items():
            if v and n_in:
                label = reason_label(s, reason)
                rates[label] = rates.get(label, 0.0) + v / n_in
    return rates


def license_variants(manifest: DatamixManifest) -> list[tuple[str, str, int]]:
    """``(family, license id, documents removed)`` of the per-document license removals
    over all sources, by family, then most removed first."""
    total: Counter = Counter()
    for src in manifest.sources:
        for f, info in SourceCounts.model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and extra.get("by_family"):
                total.update(getattr(src.counts, f))
    return sorted(((license_family(lic), lic, n) for lic, n in total.items()),
                  key=lambda t: (t[0], -t[2], t[1]))


def _spec_removal_rates(r: _Report) -> PlotSpec | None:
    rates = _removal_rates(r)
    if not rates:
        r.result.skipped["removal_rates.png"] = "no stage removed any document"
        return None
    items = sorted(rates.items(), key=lambda kv: kv[1])
    rejected = {src.name: {st: c["rejected"] for st, c in src.stages.items()
                           if isinstance(c, dict) and isinstance(c.get("rejected"), dict)}
                for src in r.manifest.sources}
    by_src = removal_rates_by_source(r.stages, r.remaining, rejected, reason_label)
    return PlotSpec("removal_rates.png", "Removal rates",
                    "Share of each source's documents entering a stage that it removed; "
                    "per-document license removals grouped by family (the largest variants "
                    "are in the table below).", "removal_rates",
                    {"items": items, "per_source": {
                        n: [by_src.get(k, {}).get(n, 0.0) for k, _ in items]
                        for n in r.names}})


def _spec_rules(r: _Report) -> PlotSpec | None:
    return rules_spec(r.out, r.result.skipped)


def _spec_clusters(r: _Report) -> PlotSpec | None:
    clusters: dict[str, Counter] = defaultdict(Counter)
    for q in r.q_rows:
        if q.get("duplicate_of"):
            clusters[q.get("stage") or "dedup"][q["duplicate_of"]] += 1
    if not clusters:
        r.result.skipped["duplicate_clusters.png"] = "no quarantined duplicates"
        return None
    per_stage = {st: dict(Counter(v + 1 for v in c.values()))
                 for st, c in sorted(clusters.items())}
    return PlotSpec("duplicate_clusters.png", "Duplicate clusters",
                    "From the quarantine's duplicate_of column.", "clusters",
                    {"per_stage": per_stage, "counts": {st: len(c) for st, c in
                                                        clusters.items()}})


def _spec_languages(r: _Report) -> PlotSpec | None:
    langs: Counter = Counter()
    for s in r.names:
        langs.update(x for x in r.sidecars.get(s, {}).get("language", []) if x)
    if not langs:
        r.result.skipped["languages.png"] = "no language column in the shard sidecars"
        return None
    return PlotSpec("languages.png", "Languages", "From the sidecars' language column.",
                    "languages", {"top": langs.most_common(25)})


def _spec_mixture(r: _Report) -> PlotSpec | None:
    toks = [sum(s.tokens.values()) for s in r.manifest.sources]
    if sum(toks) <= 0:
        r.result.skipped["mixture.png"] = "no tokens in the manifest"
        return None
    return PlotSpec("mixture.png", "Mixture",
                    "Each source's share of the mixture: tokens after curation times its "
                    "mixture weight.", "mixture",
                    {"tokens": toks, "labels": r.names,
                     "weights": [s.mixture_weight for s in r.manifest.sources]})


# the plots in report order; the first two need the token counts of removed documents
def _spec_stage_times(r: _Report) -> PlotSpec | None:
    return stage_times_spec(r.out, r.result.skipped)


_PLOTS = (_spec_waterfall, _spec_lengths, _spec_removal_rates, _spec_rules, _spec_clusters,
          _spec_languages, _spec_mixture, _spec_stage_times)
# the order of drawing: those that need no quarantine first (the rules' panels take
# longest), drawn while the quarantine is read; the last two need its token counts
_EARLY = (_spec_rules, _spec_removal_rates, _spec_mixture, _spec_stage_times)
_NEED_TOKENS = (_spec_waterfall, _spec_lengths)


def write_report(output_dir: str | os.PathLike, manifest: DatamixManifest | None = None,
                 *, workers: PlotWorkers | None = None,
                 drawn: Mapping[str, Future] | None = None) -> ReportResult:
    """Write ``report.html`` and its PNGs into ``output_dir`` (atomically, overwriting).

    Args:
        output_dir: a run's output folder (holding ``manifest.json``).
        manifest: the manifest, if already loaded.
        workers: started :class:`~tokenmill.pipeline.report.plots.PlotWorkers` to draw
            the plots in (in parallel, while this process counts the removed documents'
            tokens); None draws them here, one after the other. The files are the same.
        drawn: plots already submitted to ``workers`` from the same data, by PNG name
            (the rules plot, drawn while the run's last phases went on, into the work
            folder): waited for and moved into place, not drawn again.

    Returns:
        :class:`ReportResult`.

    Raises:
        FileNotFoundError: no ``manifest.json`` in ``output_dir``.
        ValueError: the manifest does not validate (see :func:`load_manifest`).
        ReportInputError: (a ``ValueError``) a quarantine or sidecar parquet file that
            cannot be read (one line naming the file).
        TokenizerMismatchError: the installed tokenizer is not the one the manifest records.
    """
    out = Path(output_dir)
    if out.is_file():  # the manifest.json itself, as `tokenmill manifest ...` accepts
        out = out.parent
    if manifest is None and not (out / "manifest.json").exists():
        raise FileNotFoundError(f"{out}: no manifest.json (is this a `tokenmill run` output?)")
    if manifest is None:
        manifest = load_manifest(out)
    _check_tokenizer(manifest, out / "manifest.json")
    stages, remaining = document_waterfall(manifest)
    r = _Report(out=out, manifest=manifest, result=ReportResult(html=out / REPORT_NAME),
                q_rows=[], examples={}, sidecars={}, stages=stages, remaining=remaining)
    specs: dict[Callable, PlotSpec | None] = {}
    futures: dict[Callable, Future] = {}
    early = dict(drawn or {})

    def submit(builds: Iterable[Callable]) -> None:
        for build in builds:
            specs[build] = spec = build(r)
            if spec is not None and spec.png in early:
                futures[build] = early[spec.png]
            elif workers is not None and spec is not None:
                futures[build] = workers.submit(out / spec.png, spec)

    submit(_EARLY)
    quarantine = _read_quarantine(out, manifest)
    r.q_rows, r.examples = _quarantine_rows(quarantine)
    r.sidecars = _read_sidecars(out, manifest)
    submit(b for b in _PLOTS if b not in _NEED_TOKENS and b not in specs)
    r.token_note = _count_tokens(r.q_rows, quarantine, manifest)
    r.edited = edits_html(out, manifest, quarantine, _decoder(manifest), _table)
    submit(_NEED_TOKENS)
    for build in _PLOTS:  # report order, whoever drew them
        if (spec := specs[build]) is None:
            continue
        _finish(futures.get(build), out / spec.png, spec)
        r.result.images.append(out / spec.png)
        r.sections.append((spec.title, spec.png, spec.caption))
    atomic_write_text(r.result.html, _html(r))
    return r.result


def _finish(future: Future | None, path: Path, spec: PlotSpec) -> None:
    """Wait for a worker's plot (one drawn ahead elsewhere is moved to ``path``); draw it
    here when there is no worker or it died."""
    if future is not None:
        try:
            drawn_at = Path(future.result())
            if drawn_at != path:
                os.replace(drawn_at, path)
            return
        except BrokenProcessPool as e:
            log.warning("a report worker died (%s); drawing %s here", e, spec.png)
    render(path, spec.kind, spec.data)


_STYLE = ("<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
          "text-align:right}td.l,th.l{text-align:left}img{max-width:100%}"
          "pre{white-space:pre-wrap;background:#f6f6f6;padding:4px 8px;margin:2px 0 8px}"
          ".warn{color:#a40}</style>")


def _table(header: list[str], rows: list[list[Any]], left: int = 1) -> str:
    """An HTML table, every cell escaped; the first ``left`` columns left-aligned."""
    e = html.escape

    def cells(vals: list[Any], tag: str) -> str:
        return "".join(f"<{tag}{' class=l' if i < left else ''}>{e(str(v))}</{tag}>"
                       for i, v in enumerate(vals))

    return ("<table><tr>" + cells(header, "th") + "</tr>"
            + "".join("<tr>" + cells(r, "td") + "</tr>" for r in rows) + "</table>")


def _sources_html(m: DatamixManifest, stages: list[str], remaining: dict[str, list[int]]
                  ) -> list[str]:
    warned = Counter(w.source for w in m.warnings)
    rows = [[s.name, s.license, f"{s.counts.read:,}", f"{s.counts.kept:,}",
             f"{sum(s.tokens.values()):,}", f"{s.documents.get('val', 0):,}",
             s.mixture_weight, warned.get(s.name, 0)] for s in m.sources]
    parts = ["<h2>Sources</h2>", _table(
        ["source", "license", "rows read", "documents kept", "tokens kept (train + val)",
         "validation documents", "mixture weight", "warnings"], rows, left=2)]
    if m.warnings:
        parts.append("<h2 class=warn>Warnings</h2><ul>" + "".join(
            f"<li>{html.escape(w.message)}</li>" for w in m.warnings) + "</ul>")
    parts += ["<h2>Documents remaining after each stage</h2>",
              _table(["source", *(column_label(x) for x in stages)],
                     [[n, *(f"{v:,}" for v in vals)] for n, vals in remaining.items()])]
    return parts


def decontamination_rows(m: DatamixManifest) -> list[list[Any]]:
    """Per source and eval set: ``[source, eval set, documents removed, spans cut]``, from
    the decontamination stage's reasons (``contaminated:<eval set>[:<length reason>]``)
    and ``decontamination_cuts``; empty when no source was decontaminated."""
    rows = []
    for src in m.sources:
        removed: Counter = Counter()
        for reason, n in src.stages.get("decontaminate", {}).get("rejected", {}).items():
            removed[reason.split(":")[1] if reason.count(":") else reason] += n
        for name in sorted(set(removed) | set(src.decontamination_cuts)):
            rows.append([src.name, name, removed[name], src.decontamination_cuts.get(name, 0)])
    return rows


def _decontamination_html(m: DatamixManifest) -> list[str]:
    rows = decontamination_rows(m)
    if not rows and not any("decontaminate" in s.stages for s in m.sources):
        return []
    return ["<h2>Decontamination per eval set</h2><p>Documents removed for sharing an "
            "n-gram with the eval set (in cut mode: those left too short) and spans cut out "
            "of kept documents (each an edit record <code>decontaminate:edit:&lt;eval "
            "set&gt;</code> in the quarantine).</p>",
            _table(["source", "eval set", "documents removed", "spans cut"],
                   [[a, b, f"{c:,}", f"{d:,}"] for a, b, c, d in rows], left=2)]


def _examples_html(examples: dict[str, _Examples]) -> list[str]:
    """Per removal reason: its count and up to :data:`EXAMPLES_PER_REASON` documents."""
    if not examples:
        return []
    e = html.escape
    parts = [f"<h2>What was removed</h2><p>For every removal reason, the first "
             f"{EXAMPLES_PER_REASON} removed documents in quarantine order (first "
             f"{EXAMPLE_CHARS} characters); per-document license removals by family. Every "
             "removed document is in the <code>quarantine/</code> parquet files. Edit "
             "records (reasons with <code>:edit:</code>) are spans cut or replaced in kept "
             "documents, not removals.</p>"]
    for label, ex in examples.items():
        what = "spans edited in kept documents" if is_edit_reason(label) else "removed"
        parts.append(f"<details><summary><b>{e(label)}</b>: {ex.count:,} {what}"
                     f"{f', {len(ex.shown)} shown' if ex.count > len(ex.shown) else ''}"
                     "</summary>")
        for row in ex.shown:
            note = [f"<code>{e(row.get('key') or '')}</code>"]
            if row.get("reason") and not label.startswith(row["reason"]):
                note.append(e(row["reason"]))  # the variant of a grouped reason
            if row.get("duplicate_of"):
                note.append(f"duplicate of <code>{e(row['duplicate_of'])}</code>")
            if row.get("detail"):
                note.append(e(row["detail"]))
            parts.append(f"<div>{' · '.join(note)}</div><pre>{e(row['excerpt']) or '(empty)'}"
                         "</pre>")
        parts.append("</details>")
    return parts


def _html(r: _Report) -> str:
    e = html.escape
    m = r.manifest
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>tokenmill report: {e(m.name)}</title>", _STYLE, "</head><body>",
        f"<h1>Curation report: {e(m.name)}</h1>",
        f"<p>tokenizer {e(m.tokenizer.name)}, config sha256 "
        f"<code>{e(m.config_sha256[:16])}</code></p>",
        *_sources_html(m, r.stages, r.remaining),
        *_decontamination_html(m),
    ]
    for title, png, caption in r.sections:
        parts.append(f"<h2>{e(title)}</h2><p>{e(caption)}</p>"
                     f"<img src='{e(png)}' alt='{e(title)}'>")
        if png == "removal_rates.png" and (variants := license_variants(m)):
            parts.append("<h3>Removed by per-document license</h3>" + _table(
                ["family", "license", "documents removed"],
                collapsed_license_rows(variants), left=2))
    parts += r.edited
    parts += _examples_html(r.examples)
    if r.result.skipped:
        parts.append("<h2>Plots skipped</h2><ul>" + "".join(
            f"<li>{e(k)}: {e(v)}</li>" for k, v in sorted(r.result.skipped.items())) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
