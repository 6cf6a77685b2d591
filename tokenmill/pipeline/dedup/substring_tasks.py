"""The two Ray tasks of exact-substring dedup (:mod:`tokenmill.pipeline.dedup.substring`).

:func:`index_part`
    one part: its documents' tokens (the blocks' ``substring_tokens`` less the rows earlier
    global stages removed) laid out as one text, its suffix array, the windows repeated
    inside it and its representatives (:func:`~.substring_spans.part_windows`); files
    ``work/substring_dedup/index/<digest>.{text,reps,repeated}.npy`` and ``.docs.parquet``.
:func:`cut_part`
    one part against every earlier part of its scope (:func:`~.substring_spans.found_in`):
    the token spans to cut, mapped to characters of the text; a document whose cut text
    fails the length filter is removed instead. Files: removals and edits, grouped by
    block (:data:`~tokenmill.pipeline.run.removals.REMOVALS`,
    :data:`~tokenmill.pipeline.run.removals.EDITS`).

Both outputs are content-addressed and reused on a rerun.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.atomic import atomic_open
from tokenmill.pipeline.dedup import substring_spans as spans
from tokenmill.pipeline.dedup.cut_rows import CutRows
from tokenmill.pipeline.document.length import LengthFilter
from tokenmill.pipeline.run.intermediate import StageOutput, write_parquet
from tokenmill.pipeline.run.partition_files import cached
from tokenmill.pipeline.run.prepare_task import read_block_columns
from tokenmill.pipeline.run.removals import read_removals
from tokenmill.pipeline.stage import Document
from tokenmill.tokenizers import get_encoding

INDEX_FILES = (".text.npy", ".reps.npy", ".repeated.npy", ".docs.parquet")
#: reason of the edit records (``<stage>:edit:repeat``)
EDIT_WHAT = "repeat"


@dataclass(frozen=True)
class IndexTask:
    """One part's suffix-array pass.

    Attributes:
        work: the global stages' folder; prepare_work: the prepared blocks' folder.
        earlier: the earlier global stages' removal files.
        blocks: ``(block index, block digest)`` of the part, in order.
        min_tokens: the window length; digest: the output's content address.
    """

    work: str
    prepare_work: str
    earlier: tuple[str, ...]
    blocks: tuple[tuple[int, str], ...]
    min_tokens: int
    digest: str


def _save(path: Path, arr: np.ndarray) -> None:
    with atomic_open(path) as f:
        np.save(f, arr)


def _part_docs(task: IndexTask) -> tuple[list[np.ndarray], pa.Table]:
    """The part's kept documents' tokens, and their ``block, row, key`` table."""
    docs: list[np.ndarray] = []
    where: dict[str, list] = {"block": [], "row": [], "key": []}
    for b, digest in task.blocks:
        t = read_block_columns(task.prepare_work, digest, ["key", "substring_tokens"])
        gone = set(read_removals(task.work, task.earlier, b).column("row").to_pylist())
        col = t.column("substring_tokens").combine_chunks()
        offsets = col.offsets.to_numpy()
        values = col.values.to_numpy(zero_copy_only=False).astype(np.int32)
        for row, key in enumerate(t.column("key").to_pylist()):
            if row in gone:
                continue
            docs.append(values[offsets[row] : offsets[row + 1]])
            where["block"].append(b)
            where["row"].append(row)
            where["key"].append(key)
    return docs, pa.table({"block": pa.array(where["block"], pa.int32()),
                           "row": pa.array(where["row"], pa.int32()),
                           "key": pa.array(where["key"], pa.string())})


def index_part(task: IndexTask) -> dict[str, Any]:
    """The part's text, representatives and repeated windows (module docstring); info
    ``documents`` and ``tokens`` (separators left out)."""
    out = StageOutput(task.work, "substring_dedup/index", task.digest)

    def compute() -> dict[str, Any]:
        docs, where = _part_docs(task)
        text, starts = spans.layout(docs)
        repeated, reps = spans.part_windows(text, task.min_tokens)
        _save(out.path(".text.npy"), text)
        _save(out.path(".reps.npy"), reps)
        _save(out.path(".repeated.npy"), repeated)
        write_parquet(out.path(".docs.parquet"),
                      where.append_column("start", pa.array(starts[:-1], pa.int64())))
        return {"documents": len(docs), "tokens": int(text.size - len(docs))}
    return cached(out, compute, INDEX_FILES)


@dataclass(frozen=True)
class CutTask:
    """One part's cuts.

    Attributes:
        work, prepare_work: as in :class:`IndexTask`.
        part: the part's :class:`IndexTask` digest; before: the digests of the earlier
            parts of its scope; blocks: the part's ``(block index, block digest)``.
        min_tokens: the window length; tokenizer: the encoding of ``substring_tokens``.
        filters: the length filter's config (a cut document must still pass it).
        stage: the stage's name; n_blocks: the number of prepared blocks.
        digest: the output's content address.
    """

    work: str
    prepare_work: str
    part: str
    before: tuple[str, ...]
    blocks: tuple[tuple[int, str], ...]
    min_tokens: int
    tokenizer: str
    filters: dict[str, Any]
    stage: str
    n_blocks: int
    digest: str


def _load(work: str, digest: str, suffix: str) -> np.ndarray:
    return np.load(StageOutput(work, "substring_dedup/index", digest).path(suffix))


@functools.lru_cache(maxsize=4)
def token_bytes(encoding: str) -> np.ndarray:
    """int64[ids]: UTF-8 bytes of each token id of ``encoding`` (0 for unused ids)."""
    enc = get_encoding(encoding)
    out = np.zeros(enc.max_token_value + 1, np.int64)
    for i in range(out.size):
        try:
            out[i] = len(enc.decode_single_token_bytes(i))
        except KeyError:
            pass
    return out


def cut_spans(task: CutTask) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """``(spans int64[m, 2] in the part's text, text, docs table)``: the union of the
    part's repeated windows and of its representatives found in an earlier part."""
    text = _load(task.work, task.part, ".text.npy")
    reps = _load(task.work, task.part, ".reps.npy")
    found = np.zeros(reps.size, np.bool_)
    for other in task.before:
        found |= spans.found_in(text, reps, _load(task.work, other, ".text.npy"),
                                _load(task.work, other, ".reps.npy"), task.min_tokens)
    starts = np.concatenate((_load(task.work, task.part, ".repeated.npy"), reps[found]))
    docs = pq.read_table(StageOutput(task.work, "substring_dedup/index", task.part)
                         .path(".docs.parquet"))
    return spans.covered_spans(starts, task.min_tokens, text.size), text, docs


def _doc_texts(task: CutTask, want: set[tuple[int, int]]
               ) -> dict[tuple[int, int], str]:
    """The texts of the ``(block, row)`` documents in ``want``."""
    out = {}
    blocks = dict(task.blocks)
    for b in sorted({b for b, _ in want}):
        texts = read_block_columns(task.prepare_work, blocks[b], ["text"]).column("text")
        for _, row in sorted(w for w in want if w[0] == b):
            out[(b, row)] = texts[row].as_py()
    return out


def _char_spans(text: str, tokens: np.ndarray, token_spans: list[tuple[int, int]],
                table: np.ndarray) -> list[list[int]] | None:
    """``[start, end, token_start, token_end]`` per cut, in characters of ``text`` (spans
    that meet inside a character merged); ``None`` when the tokens do not spell it."""
    ends = spans.token_byte_offsets(text, tokens, table)
    if ends is None:
        return None
    leads = spans.lead_counts(text)
    out: list[list[int]] = []
    for t0, t1 in token_spans:
        c0, c1 = spans.char_span(leads, ends, t0, t1)
        if out and c0 <= out[-1][1]:
            out[-1][1], out[-1][3] = max(out[-1][1], c1), t1
        else:
            out.append([c0, c1, t0, t1])
    return out


def cut_part(task: CutTask) -> dict[str, Any]:
    """Removals and edits of one part (module docstring); info ``by_source``: per source
    ``tokens_in``, ``tokens_removed`` (cut, or in a removed document), ``spans``,
    ``documents_edited``, ``documents_removed`` and ``unmapped`` (documents whose tokens
    did not spell their text, left whole)."""
    out = StageOutput(task.work, "substring_dedup/cut", task.digest)
    return cached(out, lambda: _compute_cut(task, out), (".removals.arrow", ".edits.arrow"))


def _compute_cut(task: CutTask, out: StageOutput) -> dict[str, Any]:
    cut, text, docs = cut_spans(task)
    starts = np.concatenate((docs.column("start").to_numpy(), [text.size]))
    doc_of = np.searchsorted(starts, cut[:, 0], side="right") - 1
    by_doc: dict[int, list[tuple[int, int]]] = {}
    for d, (s, e) in zip(doc_of.tolist(), cut.tolist(), strict=True):
        by_doc.setdefault(d, []).append((s - int(starts[d]), e - int(starts[d])))
    block_col, row_col = docs.column("block").to_pylist(), docs.column("row").to_pylist()
    keys = docs.column("key").to_pylist()
    texts = _doc_texts(task, {(block_col[d], row_col[d]) for d in by_doc})
    length, table = LengthFilter(**task.filters), token_bytes(task.tokenizer)
    rows_out = CutRows(task.stage)
    counts: dict[str, Counter] = {}
    for key, n in zip(keys, np.diff(starts) - 1, strict=True):
        counts.setdefault(key.split("/", 1)[0], Counter())["tokens_in"] += int(n)
    for d, token_spans in sorted(by_doc.items()):
        key, where = keys[d], (block_col[d], row_col[d])
        c = counts.setdefault(key.split("/", 1)[0], Counter())
        doc_text = texts[where]
        char_spans = _char_spans(doc_text, text[starts[d] : starts[d + 1] - 1], token_spans,
                                 table)
        if char_spans is None:
            c["unmapped"] += 1
            continue
        kept = "".join(doc_text[a:b] for a, b in
                       zip([0] + [s[1] for s in char_spans], [s[0] for s in char_spans]
                           + [len(doc_text)], strict=True))
        why = length.reason(Document(key, key.split("/", 1)[0], kept))
        if why is not None:
            c["documents_removed"] += 1
            c["tokens_removed"] += int(starts[d + 1] - starts[d] - 1)
            rows_out.remove(where, key, why, len(char_spans))
            continue
        c["documents_edited"] += 1
        c["spans"] += len(char_spans)
        c["tokens_removed"] += sum(e - s for s, e in token_spans)
        rows_out.edit(where, key, f"{task.stage}:edit:{EDIT_WHAT}", char_spans)
    rows_out.write(out, task.n_blocks)
    return {"by_source": {s: dict(sorted(c.items())) for s, c in sorted(counts.items())}}
