"""The report's section on edited documents: kept documents that lost spans (quarantine
edit records, reasons holding ``:edit:``), shown with the removed spans marked, and the
token counts before and after each stage that records them in the manifest
(``substring_dedup``: tokens in, removed and out, in all and per source).

An edited document is rebuilt as it entered its last cutting stage: its text in the
shards (the tokens after the leading EOT, decoded) with each of that stage's cut spans
inserted back at its ``start`` (character offsets in the text the stage saw), in order of
``start`` (:func:`rebuild`); those spans are then marked (``<del>``). The global stages
(``substring_dedup``, ``span_dedup``) all cut the prepared text, so their spans are
inserted back together. Cut records are the
edit records whose ``detail`` has ``token_start`` (a global stage's cut) or an empty
``replacement`` (decontamination's cut); replacements (PII's) are not cuts.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from tokenmill.manifests.schema import DatamixManifest
from tokenmill.manifests.shards import read_sidecar, read_tokens
from tokenmill.pipeline.run.stage_list import stage_order
from tokenmill.pipeline.stage import is_edit_reason

#: edited documents shown, and the characters of context shown around each removed span
EDITED_SHOWN = 5
CONTEXT_CHARS = 120
#: the manifest records with token counts before and after their stage
TOKEN_RECORDS = ("substring_dedup",)


def removed_keys(quarantine) -> set[str]:
    """The keys of ``quarantine`` (a table with ``key, reason``, or None) with a row that
    is not an edit record: removed documents, whose edit records (those a document stage
    wrote before a later stage removed the document) are kept to rebuild the original but
    are no edits of a kept document."""
    if quarantine is None or not quarantine.num_rows:
        return set()
    return {k for k, r in zip(quarantine.column("key").to_pylist(),
                              quarantine.column("reason").to_pylist(), strict=True)
            if not is_edit_reason(r or "")}


def edit_records(quarantine) -> dict[str, list[dict[str, Any]]]:
    """Per edited kept document key, its records of cut spans (``stage, reason, text,
    start, end``), in order of ``start``; ``quarantine`` is a table with ``key, stage,
    reason, text, detail`` (or None). A cut's ``detail`` holds ``start`` and
    ``token_start``; other edit records (replacements, as PII's) and those of removed
    documents (:func:`removed_keys`) are left out."""
    if quarantine is None or not quarantine.num_rows:
        return {}
    cols = {c: quarantine.column(c).to_pylist() for c in ("key", "stage", "reason", "detail")}
    texts = quarantine.column("text")
    removed = removed_keys(quarantine)
    out: dict[str, list[dict[str, Any]]] = {}
    for i, reason in enumerate(cols["reason"]):
        if (not is_edit_reason(reason or "") or not cols["detail"][i]
                or cols["key"][i] in removed):
            continue
        where = json.loads(cols["detail"][i])
        if "start" not in where or not ("token_start" in where
                                        or where.get("replacement") == ""):
            continue
        out.setdefault(cols["key"][i], []).append(
            {"stage": cols["stage"][i], "reason": reason, "text": texts[i].as_py() or "",
             "start": int(where["start"]), "end": int(where.get("end", where["start"])),
             "prepared": "token_start" in where})
    for recs in out.values():
        recs.sort(key=lambda r: r["start"])
    return out


def rebuild(kept: str, records: list[dict[str, Any]]) -> str:
    """The text before the edits: ``kept`` with each record's ``text`` inserted at its
    ``start`` (records in order of ``start``, offsets in the text before the edits)."""
    text = kept
    for r in records:
        text = text[: r["start"]] + r["text"] + text[r["start"]:]
    return text


def shard_texts(out: Path, manifest: DatamixManifest, keys: set[str], decode
                ) -> dict[str, str]:
    """The texts in the shards of the documents ``keys`` (``decode``: token ids -> str)."""
    found: dict[str, str] = {}
    for sh in manifest.shards():
        if len(found) == len(keys):
            break
        side = read_sidecar(out / sh.path)
        tokens = None
        for key, off, n in zip(side.column("key").to_pylist(),
                               side.column("offset").to_pylist(),
                               side.column("n_tokens").to_pylist(), strict=True):
            if key in keys:
                tokens = read_tokens(out / sh.path) if tokens is None else tokens
                found[key] = decode(tokens[off + 1 : off + n].tolist())
    return found


def _marked(original: str, records: list[dict[str, Any]]) -> str:
    """HTML of ``original`` around each removed span, the span in ``<del>``."""
    e = html.escape
    parts = []
    for r in records:
        before = original[max(0, r["start"] - CONTEXT_CHARS): r["start"]]
        span = original[r["start"]: r["end"]]
        after = original[r["end"]: r["end"] + CONTEXT_CHARS]
        parts.append(f"…{e(before)}<del>{e(span)}</del>{e(after)}…")
    return "<br>".join(parts)


def token_table(manifest: DatamixManifest) -> list[list[Any]]:
    """Rows ``stage, source, tokens in, tokens removed, tokens out, spans, documents
    edited, documents removed`` of the manifest's :data:`TOKEN_RECORDS`."""
    rows = []
    for name in TOKEN_RECORDS:
        rec = getattr(manifest, name, None)
        if not rec:
            continue
        for src, c in [*rec.get("by_source", {}).items(), ("all", rec)]:
            rows.append([name, src, f"{c['tokens_in']:,}", f"{c['tokens_removed']:,}",
                         f"{c['tokens_in'] - c['tokens_removed']:,}", f"{c['spans']:,}",
                         f"{c['documents_edited']:,}", f"{c['documents_removed']:,}"])
    return rows


def edits_html(out: Path, manifest: DatamixManifest, quarantine, decode, table) -> list[str]:
    """The report's HTML parts: token counts before and after the editing stages, and up
    to :data:`EDITED_SHOWN` edited documents with their removed spans marked. ``table``
    renders ``(header, rows, left)`` as an HTML table; ``decode`` maps token ids to text
    (None: examples left out)."""
    parts: list[str] = []
    if rows := token_table(manifest):
        parts += ["<h2>Tokens before and after editing stages</h2><p>In each stage's own "
                  "tokenization of the documents it saw; the cut documents are tokenized "
                  "again for the shards.</p>", table(
                      ["stage", "source", "tokens in", "tokens removed", "tokens out",
                       "spans cut", "documents edited", "documents removed"], rows, 2)]
    records = edit_records(quarantine)
    if not records or decode is None:
        return parts
    shown = sorted(records)[:EDITED_SHOWN]
    kept = shard_texts(out, manifest, set(shown), decode)
    parts.append(f"<h2>Edited documents</h2><p>{len(records):,} kept documents lost spans; "
                 f"the first {len(shown)} by key, each removed span struck through with "
                 f"{CONTEXT_CHARS} characters of context.</p>")
    order = {name: i for i, name in enumerate(stage_order())}
    for key in shown:
        if key not in kept:
            continue
        last = max((r["stage"] for r in records[key]), key=lambda n: order.get(n, -1))
        # the global stages all cut the prepared text: their spans are undone together
        prepared = any(r["prepared"] for r in records[key] if r["stage"] == last)
        recs = [r for r in records[key] if r["stage"] == last or (prepared and r["prepared"])]
        reasons = ", ".join(sorted({r["reason"] for r in recs}))
        parts.append(f"<div><code>{html.escape(key)}</code> · {html.escape(reasons)} · "
                     f"{len(recs)} spans</div><pre>{_marked(rebuild(kept[key], recs), recs)}"
                     "</pre>")
    return parts
