"""The per-block work of a Ray task for one unit (a file, or a group of small files).

:func:`prepare_unit` reads the unit's rows in blocks of ``block_documents`` and runs, per
block, the document stages that apply to its source (in
:data:`~tokenmill.pipeline.run.stage_list.STAGES` order), then the per-block columns of
the global stages. Every stage's output for a block is content-addressed and committed on its own:

- ``work/read/<k0>``: the block's rows as read (documents and unreadable rows);
- ``work/<stage>/<k_j>``: what stage j did to the block: the surviving keys, texts it
  changed, the documents' metadata, and its quarantine rows;
- ``work/prepare/<k>``: the block's surviving documents with the global stages' columns
  and all its quarantine rows (what the dedup decisions and the tokenize task read).

``k_j = hash(k_{j-1}, stage name, version, config)`` with ``k0 = hash(unit's files and
read settings, block index)``: changing one stage's parameters recomputes exactly that
stage and the ones after it, and a rerun after a crash skips finished blocks (without
parsing their rows) and finished stages.

A unit's files enter its key by path, size and the sha256 of their bytes (never the
mtime: archives and copies keep or reset mtimes whatever the content), hashed by the task
itself in one streaming pass just before it parses them (the parse then reads the bytes
from the page cache). New bytes in a file redo exactly that file's blocks.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill import storage
from tokenmill.atomic import sha256_file
from tokenmill.pipeline.document import measures
from tokenmill.pipeline.read.readers import is_whole_file, printable_name, read_file
from tokenmill.pipeline.run import quarantine
from tokenmill.pipeline.run.intermediate import (
    StageOutput,
    content_hash,
    fault_injection_delay,
    write_parquet,
)
from tokenmill.pipeline.run.stats import utf8_size
from tokenmill.pipeline.stage import Document, DocumentStage, GlobalStage, Rejection

if TYPE_CHECKING:  # the stage list imports the stages, which import this module
    from tokenmill.pipeline.run.stage_list import StageCall

PREPARE_VERSION = 6
READ_VERSION = 3  # 3: readers detect JSON layouts by content, BOMs, separators -> "\n"
#: the task fields that, with the files' content, make a unit's read address
READ_SETTINGS = ("source", "text_field", "max_document_bytes", "limit", "block_documents")


@dataclass(frozen=True)
class PrepareTask:
    """One unit to prepare: a data file, or a group of small one-document files.

    Attributes:
        work: the ``work/`` folder of the outputs.
        source, root, files: the source's name, its folder (a local path or a URL:
            the task then downloads the unit's files to this node's staging folder),
            the unit's files (relative).
        text_field, max_document_bytes, limit: the reader's settings.
        block_documents: rows per block.
        stages, globals: the source's document and global stages, in stage order.
        url_field: the row field whose value goes to ``metadata["url"]`` (or None).
    """

    work: str
    source: str
    root: str
    files: tuple[str, ...]
    text_field: str
    max_document_bytes: int
    limit: int | None
    block_documents: int
    stages: tuple[StageCall, ...]
    globals: tuple[StageCall, ...]
    url_field: str | None = None


@dataclass
class _Built:
    """A task's stage objects, built once: the document stages with their calls, the
    global stages, and every stage's fingerprint by name."""

    document: list[tuple[StageCall, DocumentStage]]
    globals: list[GlobalStage]
    fingerprints: dict[str, str]

    @classmethod
    def of(cls, task: PrepareTask) -> _Built:
        document = [(c, c.build()) for c in task.stages]
        globals_ = [c.build() for c in task.globals]
        return cls(document, globals_, {st.name: st.fingerprint()
                                        for st in [*(s for _, s in document), *globals_]})


def _unit_items(spec: PrepareTask, skip: int
                ) -> Iterator[tuple[str, Document | Rejection]]:
    """The unit's rows in order as ``(file, row)``, the first ``skip`` passed over."""
    root = Path(spec.root)
    files = spec.files
    if len(files) == 1:
        for item in read_file(root, files[0], spec.source, spec.text_field,
                              spec.max_document_bytes, spec.limit, skip=skip,
                              url_field=spec.url_field):
            yield files[0], item
        return
    if all(is_whole_file(rel) for rel in files):  # one row per file: skip whole files
        for rel in files[skip:]:
            for item in read_file(root, rel, spec.source, spec.text_field,
                                  spec.max_document_bytes, spec.limit):
                yield rel, item
        return
    seen = 0  # small row-format files read together: rows counted across the files
    for rel in files:
        for item in read_file(root, rel, spec.source, spec.text_field,
                              spec.max_document_bytes, spec.limit,
                              url_field=spec.url_field):
            if seen >= skip:
                yield rel, item
            seen += 1


def hash_files(root: str | os.PathLike, files: list[str]) -> list[list]:
    """``[[path, size in bytes, sha256 hex]]`` of ``files`` (relative to ``root``), each
    read once in 1 MiB chunks.

    Raises:
        OSError: a file cannot be read (the unit's task fails naming it).
    """
    out = []
    for rel in files:
        path = Path(root) / rel
        out.append([rel, path.stat().st_size, sha256_file(path)])
    return out


def unit_digest(spec: PrepareTask, files: list[list]) -> str:
    """A unit's read address: its read settings and its files' ``[path, size, sha256]``."""
    settings = {k: getattr(spec, k) for k in READ_SETTINGS}
    if spec.url_field is not None:  # only when set: unchanged addresses for sources without
        settings["url_field"] = spec.url_field
    return content_hash("read", READ_VERSION, settings, files)


def block_keys(spec: PrepareTask, digest: str, index: int, fingerprints: dict[str, str]
               ) -> dict[str, str]:
    """The content addresses of block ``index``'s outputs: ``read``, each document
    stage's (chained), and ``prepare``; ``digest`` is the unit's (:func:`unit_digest`)."""
    key = content_hash(digest, "block", index)
    keys = {"read": key}
    for call in spec.stages:
        key = content_hash(key, call.name, fingerprints[call.name], call.kwargs)
        keys[call.name] = key
    keys["prepare"] = content_hash(key, "prepare", PREPARE_VERSION,
                                   [(c.name, fingerprints[c.name]) for c in spec.globals])
    return keys


def prepare_unit(spec: PrepareTask) -> dict[str, Any]:
    """Hash, read and prepare one unit, block by block (the stage objects built once).

    Returns ``{"files": [[path, size, sha256]], "hash_seconds": float (wall), "hash_cpu":
    float (CPU seconds), "blocks": [...]}`` with, per block in order, ``{"digest", "info",
    "reused": {stage: bool}, "timings": {stage: [CPU seconds, documents in, UTF-8 bytes
    in]} (the stages it computed; :mod:`~tokenmill.pipeline.run.stats`)}``; info holds
    the counters (``read``, ``docs``, ``last``, ``stages``, and ``files``: per file of the
    block, by its printable name, ``{"docs": documents it yields, "rejected": {reason:
    rows}}``, counting the rows the reader and the quarantining stages (normalize)
    quarantined).
    """
    fault_injection_delay()
    if storage.is_url(spec.root):  # a source in an object store: this unit's files, here
        staged = storage.local_dir(spec.root)
        try:
            for rel in spec.files:
                storage.download(storage.join(spec.root, rel), staged / rel)
            return _prepare_local(replace(spec, root=str(staged)))
        finally:
            for rel in spec.files:
                (staged / rel).unlink(missing_ok=True)
    return _prepare_local(spec)


def _prepare_local(spec: PrepareTask) -> dict[str, Any]:
    t0, cpu0 = time.perf_counter(), time.process_time()
    files = hash_files(spec.root, list(spec.files))
    hash_seconds = time.perf_counter() - t0
    hash_cpu = time.process_time() - cpu0
    digest = unit_digest(spec, files)
    blocks: list[dict[str, Any]] = []
    built = _Built.of(spec)
    for index in itertools.count():
        keys = block_keys(spec, digest, index, built.fingerprints)
        out = StageOutput(spec.work, "prepare", keys["prepare"])
        done = out.load_done()
        timings: dict[str, list[float]] = {}
        if done is None:
            info, reused = _prepare_block(spec, built, index, keys, out, timings)
        else:
            info, reused = done["info"], {name: True for name in keys}
        blocks.append({"digest": keys["prepare"], "info": info, "reused": reused,
                       "timings": timings})
        if info["last"]:
            return {"files": files, "hash_seconds": hash_seconds, "hash_cpu": hash_cpu,
                    "blocks": blocks}
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------
# stored documents: key, text as UTF-8 bytes (lone surrogates kept), metadata as JSON
# ---------------------------------------------------------------------------------------
def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


def _docs_table(docs: list[Document], changed: list[bool] | None = None) -> pa.Table:
    texts = [d.text.encode("utf-8", "surrogatepass") if changed is None or changed[i]
             else None for i, d in enumerate(docs)]
    metas = [json.dumps(d.metadata, sort_keys=True, default=_json_default)
             if d.metadata else None for d in docs]
    return pa.table({"key": pa.array([d.key for d in docs], pa.string()),
                     "text": pa.array(texts, pa.large_binary()),
                     "meta": pa.array(metas, pa.large_string())})


def _apply_table(docs: dict[str, Document] | None, table: pa.Table,
                 source: str) -> list[Document]:
    """The documents a stored table lists, in its order: texts it holds replace the
    earlier ones (``docs``, by key), metadata is replaced."""
    out = []
    for key, text, meta in zip(*(table.column(c).to_pylist() for c in ("key", "text", "meta")),
                               strict=True):
        doc = docs[key] if docs is not None else Document(key=key, source=source, text="")
        if text is not None:
            doc.text = text.decode("utf-8", "surrogatepass")
        doc.metadata = json.loads(meta) if meta else {}
        out.append(doc)
    return out


def _commit(out: StageOutput, docs: pa.Table, rejected: pa.Table,
            info: dict[str, Any]) -> None:
    out.dir.mkdir(parents=True, exist_ok=True)
    write_parquet(out.path(".docs.parquet"), docs)
    quarantine.write_quarantine(out.path(".quarantine.parquet"), rejected)
    out.commit([".docs.parquet", ".quarantine.parquet"], info)


# ---------------------------------------------------------------------------------------
# the stages of one block
# ---------------------------------------------------------------------------------------
def _read_block(spec: PrepareTask, index: int, out: StageOutput
                ) -> tuple[list[Document], dict[str, Any], bool]:
    """The block's documents as read, its read info (``read``, ``last``, ``rejected``)
    and whether the stored read output was reused."""
    done = out.load_done()
    if done is not None:
        docs = _apply_table(None, pq.read_table(out.path(".docs.parquet")), spec.source)
        return docs, done["info"], True
    n = spec.block_documents
    items = itertools.islice(_unit_items(spec, index * n), n + 1)
    docs: list[Document] = []
    rejected: list[Rejection] = []
    per_file: dict[str, dict[str, Any]] = {}
    n_read, last = 0, True
    for rel, item in items:
        if n_read == n:  # a row beyond this block exists: not the last block
            last = False
            break
        n_read += 1
        counts = per_file.setdefault(printable_name(rel), {"docs": 0, "rejected": {}})
        if isinstance(item, Rejection):
            rejected.append(item)
            counts["rejected"][item.reason] = counts["rejected"].get(item.reason, 0) + 1
        else:
            docs.append(item)
            counts["docs"] += 1
    reasons: dict[str, int] = {}
    for r in rejected:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    info = {"read": n_read, "last": last, "rejected": dict(sorted(reasons.items())),
            "files": per_file}
    _commit(out, _docs_table(docs), quarantine.to_table(rejected), info)
    return docs, info, False


def _document_stage(out: StageOutput, step: DocumentStage, docs: list[Document]
                    ) -> tuple[list[Document], dict[str, Any], bool]:
    """Run (or reuse) one document stage over a block's documents (its counters reset
    first: ``info`` holds this block's)."""
    done = out.load_done()
    if done is not None:
        table = pq.read_table(out.path(".docs.parquet"))
        return _apply_table({d.key: d for d in docs}, table, ""), done["info"], True
    step.reset_counters()
    if hasattr(step, "measures"):  # a filter's rule measures: this block's only
        step.measures = measures.Measures()
    rejected: list[Rejection] = []
    step.sink = rejected.append
    before = {d.key: d.text for d in docs}
    kept = list(step(iter(docs)))
    info = step.stats.to_dict()
    if step.extra:
        info["extra"] = dict(sorted(step.extra.items()))
    record = measures.block_record("", 0, [step])
    if record["histograms"]:  # kept with the stage's output, so a reused stage has it too
        info["measures"] = {"histograms": record["histograms"][step.name],
                            "thresholds": record["thresholds"]}
    _commit(out, _docs_table(kept, [d.text != before[d.key] for d in kept]),
            quarantine.to_table(rejected), info)
    return kept, info, False


def _lap(timings: dict[str, list[float]], name: str, since: float, computed: bool,
         documents: int, nbytes: int) -> float:
    """Record ``[CPU seconds since since, documents, nbytes]`` under ``name`` when the
    stage was computed (not reused); returns the clock now."""
    now = time.process_time()
    if computed:
        timings[name] = [now - since, documents, nbytes]
    return now


def _count_quarantined(source: str, stages: dict[str, Any], files: dict[str, Any],
                       q_paths: list[Path], quarantining: set[str]) -> None:
    """Add, per file of ``files`` (the read info's), the rows the document stages in
    ``quarantining`` (``counts="quarantined"``: their removals are unusable rows, so a
    file none of whose rows passes them yields no document) quarantined: to its
    ``rejected`` reasons, and ``docs`` less them (the documents it yields)."""
    prefix = len(source) + 1  # keys are source/file#row
    for name, path in zip(stages, q_paths, strict=True):
        if name == "read" or name not in quarantining:
            continue
        for key, reason in zip(*(quarantine.read_quarantine(path).column(c).to_pylist()
                                 for c in ("key", "reason")), strict=True):
            f = files.get(key[prefix:key.rindex("#")])
            if f is not None:
                f["docs"] -= 1
                f["rejected"][reason] = f["rejected"].get(reason, 0) + 1


def _prepare_block(spec: PrepareTask, built: _Built, index: int, keys: dict[str, str],
                   out: StageOutput, timings: dict[str, list[float]]
                   ) -> tuple[dict[str, Any], dict[str, bool]]:
    """Prepare block ``index``; ``timings`` receives, per stage it computed, ``[CPU
    seconds, documents in, UTF-8 bytes in]`` (``prepare``: the rest of the block's work)."""
    work = spec.work
    cpu0 = clock = time.process_time()
    read_out = StageOutput(work, "read", keys["read"])
    docs, read_info, reused_read = _read_block(spec, index, read_out)
    sizes = {d.key: utf8_size(d.text) for d in docs}
    clock = _lap(timings, "read", clock, not reused_read, len(docs), sum(sizes.values()))
    reused = {"read": reused_read}
    problems = [read_out.problem] if read_out.problem else []
    stages: dict[str, Any] = {"read": {"rejected": read_info["rejected"]}}
    q_paths = [read_out.path(".quarantine.parquet")]
    for call, step in built.document:
        name = call.name
        st_out = StageOutput(work, name, keys[name])
        n_in, bytes_in = len(docs), sum(sizes[d.key] for d in docs)
        docs, stages[name], reused[name] = _document_stage(st_out, step, docs)
        clock = _lap(timings, name, clock, not reused[name], n_in, bytes_in)
        problems += [st_out.problem] if st_out.problem else []
        q_paths.append(st_out.path(".quarantine.parquet"))
    files = {f: {"docs": c["docs"], "rejected": dict(c["rejected"])}
             for f, c in read_info["files"].items()}
    _count_quarantined(spec.source, stages, files, q_paths,
                       {c.name for c in spec.stages if c.stage.counts == "quarantined"})
    cols: dict[str, Any] = {
        "key": pa.array([d.key for d in docs], pa.string()),
        "text": pa.array([d.text for d in docs], pa.large_string()),
    }
    for col, typ in (m for c in spec.stages for m in c.stage.metadata):
        cols[col] = pa.array([d.metadata.get(col) for d in docs], typ)
    n_in, bytes_in = len(docs), sum(sizes[d.key] for d in docs)
    for g in built.globals:
        clock = time.process_time()
        cols.update(g.block_columns(docs))
        _lap(timings, g.name, clock, True, n_in, bytes_in)
    # the stages' rows by key (a stable sort, as Python's), kept in Arrow: the removed
    # documents' texts are most of a block's bytes, never turned into Python objects
    rejected = pa.concat_tables([quarantine.read_quarantine(p) for p in q_paths]
                                ).sort_by("key").combine_chunks()
    info = {"read": read_info["read"], "docs": len(docs), "last": read_info["last"],
            "stages": stages, "files": files}
    _commit(out, pa.table(cols), rejected, info)
    reused["prepare"] = False
    timed = sum(t[0] for t in timings.values())
    timings["prepare"] = [time.process_time() - cpu0 - timed, n_in, bytes_in]
    if out.problem:
        problems.append(out.problem)
    return info | ({"recovered": problems} if problems else {}), reused


def read_block_columns(work: str, digest: str, columns: list[str]) -> pa.Table:
    """Columns of a prepared block (``key``, ``text``, metadata, global stages' columns)."""
    return pq.read_table(StageOutput(work, "prepare", digest).path(".docs.parquet"),
                         columns=columns)


def block_column_names(work: str, digest: str) -> list[str]:
    """The columns a prepared block has (a global stage configured for some sources only
    finds its columns in their blocks only)."""
    return pq.read_schema(StageOutput(work, "prepare", digest).path(".docs.parquet")).names
