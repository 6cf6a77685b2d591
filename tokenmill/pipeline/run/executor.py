"""The executor: plans units of work and runs the stages of
:data:`~tokenmill.pipeline.run.stage_list.STAGES` on Ray. It knows stages only by their scope.

Order of work for ``tokenmill run``:

1. resolve sources (local folders, Hub snapshots) and refuse missing or disallowed
   licenses, all in one error;
2. ``prepare`` tasks, one per unit (a data file, or up to ``files_per_block`` small
   files): hash its files (size and sha256 key its blocks), read, then the source's
   ``document`` stages, then the ``global`` stages' per-block columns, committed per
   block of ``block_documents`` rows and per stage (:mod:`tokenmill.pipeline.run.prepare_task`);
3. the ``global`` stages' decisions, in order (each stage's ``decide``, in hash
   partitions on Ray; :mod:`tokenmill.pipeline.run.removals`: per block, a removals file);
4. the ``block`` stage (tokenize) per block: drop the removed documents, tokenize
   (:mod:`tokenmill.pipeline.run.tokenize_task`);
5. the ``source`` stage (shard writing) per source: shards, sidecars, quarantine
   (:mod:`tokenmill.pipeline.run.shard_writer`);
6. the manifest (:mod:`tokenmill.pipeline.run.accounting`: counts, input files, warnings),
   written last and atomically.

Every output is content-addressed by its inputs and its stage's version and config, so
the result is byte-identical whatever the number of Ray workers, and a rerun reuses
finished blocks and stages. Every task receives a frozen dataclass (its spec, with the
stages as :class:`~tokenmill.pipeline.run.stage_list.StageCall`) and builds its stage
objects once; the tasks run through :mod:`tokenmill.pipeline.run.tasks`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill import storage
from tokenmill.manifests.schema import (
    MANIFEST_NAME,
    CurationWarning,
    DatamixManifest,
    InputFile,
    QuarantineEntry,
)
from tokenmill.manifests.shards import version_for_vocab
from tokenmill.outputlock import output_lock
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.document import measures
from tokenmill.pipeline.read.readers import is_whole_file, printable_name
from tokenmill.pipeline.read.sources import ResolvedSource, resolve_sources
from tokenmill.pipeline.run import stage_list
from tokenmill.pipeline.run.accounting import file_documents, source_entry, source_warnings
from tokenmill.pipeline.run.intermediate import content_hash
from tokenmill.pipeline.run.prepare_task import PrepareTask, prepare_unit
from tokenmill.pipeline.run.removals import decide_global
from tokenmill.pipeline.run.shard_writer import WriteSourceTask, write_source_part
from tokenmill.pipeline.run.startup_worker import StartupWorker
from tokenmill.pipeline.run.stats import STATS_NAME, RunStats
from tokenmill.pipeline.run.tasks import run_each, run_each_timed
from tokenmill.pipeline.run.tokenize_task import TokenizeTask, tokenize_block
from tokenmill.raysession import cluster_cpus, ray_session, starts_local_ray
from tokenmill.tokenizers import TokenizerIdentity, same_tokenizer

log = logging.getLogger(__name__)


@dataclass
class Block:
    """Up to ``block_documents`` rows of a unit: the granularity of resume."""

    source: ResolvedSource
    prepare_digest: str
    prepare_info: dict[str, Any]
    stage_reused: dict[str, bool] = field(default_factory=dict)
    tokenize_digest: str = ""
    tokenize_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Unit:
    source: ResolvedSource
    files: list[str]
    size: int = 0  # bytes of its files, as listed (the planned order of work)
    #: [[path, size, sha256]] of its files, as its prepare task hashed them
    hashed: list[list] = field(default_factory=list)
    hash_seconds: float = 0.0


@dataclass
class RunResult:
    manifest_path: Path  # on this node (for an object-store output: its staging copy)
    manifest: DatamixManifest
    seconds: float
    reused_units: int  # blocks whose prepare and tokenize outputs were both reused
    total_units: int  # blocks in all
    reused_prepare: int = 0
    reused_tokenize: int = 0
    recovered: list[str] = field(default_factory=list)  # corrupt intermediates recomputed
    # per stage name: [blocks whose output was reused, blocks computed]
    stage_blocks: dict[str, list[int]] = field(default_factory=dict)
    input_bytes: int = 0  # bytes of the input files (each hashed once per run)
    hash_seconds: float = 0.0  # task time spent hashing them (summed over tasks)
    #: CPU time per stage and wall time per phase (what ``stats.json`` holds)
    stats: RunStats = field(default_factory=RunStats.empty)
    output: str = ""  # the output folder: a local path or an object-store URL
    #: per stage name, its edits of the kept documents: ``{"spans", "documents"}``
    edits: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def warnings(self) -> list[CurationWarning]:
        """The manifest's warnings (empty files and sources, high quarantine shares)."""
        return self.manifest.warnings


#: A row-format file smaller than this is read in a unit with its neighbours (in name
#: order), up to :data:`GROUP_BYTES` or :data:`GROUP_FILES` files: a task and a block per
#: small file cost more than reading it.
SMALL_FILE_BYTES = 4 << 20
GROUP_BYTES = 16 << 20
GROUP_FILES = 256
#: A source with fewer small files keeps one unit per file: a change to one file then
#: redoes only its own block, and the few tasks cost little.
GROUP_MIN_FILES = 16


def file_size(src: ResolvedSource, rel: str) -> int:
    """Bytes of ``src``'s file ``rel`` (from the listing for a remote source);
    :data:`SMALL_FILE_BYTES` for a file that cannot be read now (its task reports it)."""
    try:
        return src.sizes[rel] if src.url else (src.root / rel).stat().st_size
    except (OSError, KeyError):
        return SMALL_FILE_BYTES


def row_groups(src: ResolvedSource, rows: list[str],
               sizes: dict[str, int] | None = None) -> list[list[str]]:
    """Row-format files in units: a file of :data:`SMALL_FILE_BYTES` or more alone, runs
    of smaller ones (in name order) together up to :data:`GROUP_BYTES` / :data:`GROUP_FILES`
    (when the source has at least :data:`GROUP_MIN_FILES` small files). ``sizes``: the
    files' :func:`file_size`, when the caller has them."""
    if sizes is None:
        sizes = {f: file_size(src, f) for f in rows}
    if sum(1 for n in sizes.values() if n < SMALL_FILE_BYTES) < GROUP_MIN_FILES:
        return [[f] for f in rows]
    groups: list[list[str]] = []
    run: list[str] = []
    size = 0
    for f in rows:
        n = sizes[f]
        if n >= SMALL_FILE_BYTES:
            if run:
                groups.append(run)
            groups.append([f])
            run, size = [], 0
            continue
        if run and (size + n > GROUP_BYTES or len(run) >= GROUP_FILES):
            groups.append(run)
            run, size = [], 0
        run.append(f)
        size += n
    return groups + ([run] if run else [])


def plan_units(cfg: DatamixConfig, sources: list[ResolvedSource]) -> list[Unit]:
    """Split every source into units: each large row-format file alone, small ones
    grouped (:func:`row_groups`); whole-file documents in groups of ``files_per_block``.
    The plan depends only on the file lists and their sizes."""
    out = []
    for src in sources:
        whole = [f for f in src.files if is_whole_file(f)]
        rows = [f for f in src.files if not is_whole_file(f)]
        sizes = {f: file_size(src, f) for f in src.files}  # one stat per file
        groups = row_groups(src, rows, sizes)
        groups += [whole[i : i + cfg.files_per_block]
                   for i in range(0, len(whole), cfg.files_per_block)]
        for files in sorted(groups):
            out.append(Unit(source=src, files=files,
                            size=sum(sizes[f] for f in files)))
    return out


def run_datamix(
    cfg: DatamixConfig, *, ray_address: str | None = None, num_cpus: int | None = None,
    progress: bool = True, on_measures: Callable[[Path], None] | None = None,
) -> RunResult:
    """Curate a datamix into shards + manifest under ``cfg.output_dir``.

    Holds the output folder's lock (:mod:`tokenmill.outputlock`) while it runs.
    ``on_measures(folder)`` is called once the filters' rule measures are written to
    ``folder/measures`` (``folder``: ``work/report-ahead`` of this node's output folder or
    its staging copy; the run's ``work/measures`` is written with the manifest), while the
    dedup decisions, tokenization and shard writing are still to come: the report draws
    its rules plot meanwhile.

    Raises:
        SourceError / LicenseError: before any work, naming the source (and license).
        OutputLockedError: another run holds the output folder (names it).
    """
    t0 = time.perf_counter()
    tok = cfg.tokenizer_identity()  # fails early when the tokenizer files are missing
    sources = resolve_sources(cfg)
    out = storage.normalize(cfg.output_dir)  # a local folder or an object-store URL
    plan = plan_units(cfg, sources)
    stats = RunStats.empty()
    with output_lock(out):
        for sc in cfg.sources:  # the stages' inputs (eval sets, models, lists) are read
            for scope in ("document", "global"):  # and refused before Ray starts
                stage_list.calls(cfg, sc, scope)
        specs = _prepare_specs(cfg, plan, storage.join(out, "work"))
        stats.phases["plan"] = time.perf_counter() - t0
        # an embedded Ray takes seconds to start: meanwhile a forked process prepares the
        # smallest units (Ray gets the largest first)
        with StartupWorker(prepare_unit, specs, largest_first(plan),
                           enabled=starts_local_ray(ray_address)) as startup:
            with ray_session(ray_address, num_cpus, shutdown_behind=True):
                startup.stop()
                stats.phases["ray start"] = time.perf_counter() - t0 - stats.phases["plan"]
                stats.cpus = cluster_cpus()
                return _execute(cfg, tok, sources, plan, specs, startup, out, progress, t0,
                                stats, on_measures)


def largest_first(plan: list[Unit]) -> list[int]:
    """Indices of ``plan``'s units, the most input bytes first (ties in plan order): Ray
    gets them in this order, so that no large unit starts last and holds the run up."""
    return sorted(range(len(plan)), key=lambda i: (-plan[i].size, i))


def tokenizer_change(cfg: DatamixConfig) -> str | None:
    """One line when ``cfg``'s output folder holds a manifest made with another tokenizer
    identity than the one this run loads (its shards would be re-tokenized and the manifest
    would record the new identity); ``None`` otherwise (no manifest, same tokenizer)."""
    path = storage.join(storage.normalize(cfg.output_dir), MANIFEST_NAME)
    try:
        recorded = TokenizerIdentity.model_validate(
            json.loads(storage.read_bytes(path).decode("utf-8"))["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError, storage.StorageError):
        return None  # no earlier manifest, or one that cannot say
    loaded = cfg.tokenizer_identity()
    if same_tokenizer(recorded, loaded):
        return None
    folder = storage.redact(path.rsplit("/", 1)[0])
    return (f"output folder {folder} holds data made with tokenizer {recorded.short()}, "
            f"this run loads {loaded.short()}: every shard is re-tokenized and its manifest "
            f"will record {loaded.short()}")


def _prepare_specs(cfg: DatamixConfig, plan: list[Unit], work: str) -> list[PrepareTask]:
    """The prepare task of every unit: hash + read + document stages + the global stages'
    columns."""
    specs = []
    for u in plan:
        sc = u.source.config
        specs.append(PrepareTask(
            work=work, source=u.source.name, root=u.source.url or str(u.source.root),
            files=tuple(u.files), text_field=sc.text_key,
            max_document_bytes=cfg.max_document_bytes, limit=sc.max_documents,
            block_documents=cfg.block_documents,
            stages=stage_list.calls(cfg, sc, "document"),
            globals=stage_list.calls(cfg, sc, "global"), url_field=sc.url_field))
    return specs


def _prepare(plan: list[Unit], specs: list[PrepareTask], startup: StartupWorker,
             progress: bool, stats: RunStats) -> list[Block]:
    """The prepare tasks, per unit on Ray (or in ``startup``'s process, those it took);
    their CPU time added to ``stats``."""
    per_unit = run_each(prepare_unit, specs, "read+normalize", progress, startup=startup)
    stats.units, stats.startup_units = len(specs), len(startup.stop())
    for u, res in zip(plan, per_unit, strict=True):
        u.hashed, u.hash_seconds = res["files"], res["hash_seconds"]
        stats.row("read").add(res["hash_cpu"], blocks=0)
        for b in res["blocks"]:
            stats.merge(b["timings"])
            for name, was in b["reused"].items():
                stats.row(name).reused += bool(was)
    return [Block(source=u.source, prepare_digest=b["digest"], prepare_info=b["info"],
                  stage_reused=b["reused"])
            for u, res in zip(plan, per_unit, strict=True) for b in res["blocks"]]


def _decide(cfg: DatamixConfig, blocks: list[Block], work: str, progress: bool,
            stats: RunStats) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The global stages' decisions, in order, in hash partitions on Ray
    (:func:`~tokenmill.pipeline.run.removals.decide_global`): per block its removals
    file's digest, and the stages' manifest records by stage name."""
    src = cfg.sources[0]  # global stages are configured per datamix, not per source
    global_stages = [c.build() for c in stage_list.calls(cfg, src, "global")]
    cpu: dict[str, float] = {}
    out = decide_global(work, [b.prepare_digest for b in blocks], global_stages,
                        cfg.dedup.partitions, progress, cpu)
    docs = sum(b.prepare_info["docs"] for b in blocks)
    for name, seconds in cpu.items():  # a stage's columns counted its blocks already
        gather = name == "removals"
        stats.row(name).add(seconds, docs if gather else 0, blocks=len(blocks) if gather else 0)
    return out


def _tokenize(cfg: DatamixConfig, tok: TokenizerIdentity, blocks: list[Block],
              removals: list[dict[str, Any]], work: str, progress: bool,
              stats: RunStats) -> None:
    """The block stage (tokenize), per block on Ray; each task reads its block's removals."""
    call, = stage_list.calls(cfg, cfg.sources[0], "block")
    fingerprint = call.build().fingerprint()
    meta = stage_list.metadata_names()
    specs = []
    for b, dups in zip(blocks, removals, strict=True):
        b.tokenize_digest = content_hash(call.name, fingerprint, tok.model_dump(),
                                         b.prepare_digest, dups["content"])
        specs.append(TokenizeTask(work, b.tokenize_digest, b.prepare_digest,
                                  b.source.name, storage.join(work, "dedup"), dups["removals"],
                                  call, meta))
    infos = run_each(tokenize_block, specs, "tokenize", progress)
    for b, info in zip(blocks, infos, strict=True):
        stats.merge(info.pop("timings", {}))
        stats.row(call.name).reused += bool(info["reused"])
        b.tokenize_info = info


def _write(cfg: DatamixConfig, tok: TokenizerIdentity, sources: list[ResolvedSource],
           blocks: list[Block], out: str, progress: bool, stats: RunStats,
           input_bytes: list[int]) -> list[dict[str, Any]]:
    """The source stage (shard writing), per source on Ray: its shards and sidecars in
    one task, its quarantine file in another."""
    # From here the shards change: a manifest of an earlier run must not sit beside them
    # (a crash now leaves no manifest, never a manifest that lies).
    storage.remove(storage.join(out, MANIFEST_NAME))
    (storage.local_dir(out) / MANIFEST_NAME).unlink(missing_ok=True)
    _remove_stale_sources(out, {s.name for s in sources})
    specs = []
    for src in sources:
        call, = stage_list.calls(cfg, src.config, "source")
        specs.append(WriteSourceTask(
            work=storage.join(out, "work"), output_dir=out, source=src.name,
            units=tuple((b.prepare_digest, b.tokenize_digest)
                        for b in blocks if b.source is src),
            shards=call.build(), shard_version=version_for_vocab(tok.n_vocab),
            meta_columns=stage_list.metadata_names()))
    # a source's shards and its quarantine file are two tasks; the sources with the most
    # input bytes first, so that the largest pieces of work do not start last
    order = sorted(range(len(specs)), key=lambda i: (-input_bytes[i], i))
    parts = [(i, part) for i in order for part in ("quarantine", "shards")]
    done = run_each_timed(write_source_part, [(specs[i], part) for i, part in parts],
                          "write shards", progress)
    written: list[dict[str, Any]] = [{} for _ in specs]
    seconds = [0.0] * len(specs)
    for (i, _), (result, secs) in zip(parts, done, strict=True):
        written[i].update(result)
        seconds[i] += secs
    for src, secs in zip(sources, seconds, strict=True):
        infos = [b.tokenize_info for b in blocks if b.source is src]
        stats.row(call.name).add(secs, sum(i["kept"] for i in infos),
                                 sum(i.get("text_bytes", 0) for i in infos))
    return written


def _execute(cfg, tok, sources, plan, specs, startup, out, progress, t0,
             stats: RunStats, on_measures: Callable[[Path], None] | None) -> RunResult:
    work = storage.join(out, "work")
    out_dir = storage.local_dir(out)
    lap = _lap_clock(stats)
    blocks = _prepare(plan, specs, startup, progress, stats)
    records = {src.name: [b.prepare_info["stages"] for b in blocks if b.source is src]
               for src in sources}
    if on_measures is not None:
        # the report's early rules plot reads a copy, moved into place by the finished
        # run's report: a run stopped before its manifest leaves the last run's as it was
        ahead = out_dir / "work" / "report-ahead"
        measures.write_records(ahead / "measures", records)
        on_measures(ahead)
    lap("prepare")
    removals, decided = _decide(cfg, blocks, work, progress, stats)
    lap("decide")
    _tokenize(cfg, tok, blocks, removals, work, progress, stats)
    lap("tokenize")
    written = _write(cfg, tok, sources, blocks, out, progress, stats,
                     [sum(u.size for u in plan if u.source is src) for src in sources])
    lap("write")
    entries: list = []
    warnings: list[CurationWarning] = []
    for src, w in zip(sources, written, strict=True):
        prepared = [(b.prepare_info, b.tokenize_info) for b in blocks if b.source is src]
        files = _input_files(src, [u for u in plan if u.source is src])
        entries.append(source_entry(src, prepared, w, files))
        warnings += link_warnings(src)
        warnings += source_warnings(entries[-1], file_documents(
            src.files, [p for p, _ in prepared]), cfg.checks.max_quarantine_share)
    manifest = DatamixManifest(
        name=cfg.name, config=cfg.content_dict(), config_sha256=cfg.sha256(), tokenizer=tok,
        sources=entries, quarantine=[QuarantineEntry(**w["quarantine"]) for w in written],
        warnings=warnings, **decided)
    path = manifest.write(out_dir)
    measures.write_records(out_dir / "work" / "measures", records)
    if storage.is_url(out):  # the records, then the manifest: the run's commit, last
        storage.upload_tree(out_dir / "work" / "measures", storage.join(out, "work", "measures"))
        storage.upload(path, storage.join(out, MANIFEST_NAME))
    lap("manifest")
    res = _result(path, manifest, blocks, time.perf_counter() - t0)
    res.output = out
    res.input_bytes = sum(f.size for e in entries for f in e.files)
    res.hash_seconds = sum(u.hash_seconds for u in plan)
    stats.wall_seconds = res.seconds
    stats.write(out_dir)  # beside the manifest, never in it: times differ between runs
    if storage.is_url(out):
        storage.upload(out_dir / STATS_NAME, storage.join(out, STATS_NAME))
    res.stats = stats
    return res


def _lap_clock(stats: RunStats):
    """``lap(name)``: record the wall seconds since the previous lap as phase ``name``."""
    last = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        stats.phases[name] = now - last[0]
        last[0] = now
    return lap


def link_warnings(src: ResolvedSource) -> list[CurationWarning]:
    """One ``skipped_link`` warning per link of ``src`` that was not followed."""
    return [CurationWarning(
        kind="skipped_link", source=src.name, file=printable_name(k.rel),
        message=f"source {src.name!r}: not read: {printable_name(k.rel)} is a link to "
                f"{printable_name(k.target)} ({k.why})") for k in src.skipped_links]


def _input_files(src: ResolvedSource, units: list[Unit]) -> list[InputFile]:
    """The source's data files with size and sha256, in the source's file order."""
    hashed = {rel: (size, sha) for u in units for rel, size, sha in u.hashed}
    return [InputFile(path=printable_name(rel), size=hashed[rel][0], sha256=hashed[rel][1])
            for rel in src.files]


def _result(path: Path, manifest: DatamixManifest, blocks: list[Block],
            seconds: float) -> RunResult:
    reused = sum(1 for b in blocks if b.stage_reused.get("prepare") and
                 b.tokenize_info.get("reused"))
    res = RunResult(path, manifest, seconds, reused, len(blocks))
    res.reused_prepare = sum(1 for b in blocks if b.stage_reused.get("prepare"))
    res.reused_tokenize = sum(1 for b in blocks if b.tokenize_info.get("reused"))
    res.recovered = sorted({p for b in blocks for p in b.prepare_info.get("recovered", []) +
                            b.tokenize_info.get("recovered", [])})
    tally: dict[str, Counter] = {}
    block_stage = stage_list.of_scope("block")[0].name  # the tokenize stage
    for b in blocks:
        for name, was in [*b.stage_reused.items(), (block_stage, b.tokenize_info["reused"])]:
            tally.setdefault(name, Counter())[bool(was)] += 1
    res.stage_blocks = {n: [c[True], c[False]] for n, c in tally.items()}
    edits: dict[str, Counter] = {}
    for b in blocks:
        for name, c in b.tokenize_info.get("edits", {}).items():
            edits.setdefault(name, Counter()).update(c)
    res.edits = {n: dict(c) for n, c in edits.items()}
    for p in res.recovered:
        log.warning("recomputed a corrupt or incomplete intermediate: %s", p)
    return res


def _remove_stale_sources(out: str, names: set[str]) -> None:
    """Shards and quarantine files of sources this datamix no longer has are deleted, so
    that a glob over ``shards/`` (as modded-nanogpt's loader does) finds only this run's."""
    if storage.is_url(out):
        for rel in storage.list_tree(storage.join(out, "shards")):
            if "/" in rel and rel.split("/", 1)[0] not in names:
                storage.remove(storage.join(out, "shards", rel))
        for rel in storage.list_tree(storage.join(out, "quarantine")):
            if rel.endswith(".parquet") and rel.removesuffix(".parquet") not in names:
                storage.remove(storage.join(out, "quarantine", rel))
        return
    out_dir = Path(out)
    for p in sorted((out_dir / "shards").glob("*")):
        if p.is_dir() and p.name not in names:
            log.warning("removing shards of a source no longer in the datamix: %s", p)
            shutil.rmtree(p)
    for p in sorted((out_dir / "quarantine").glob("*.parquet")):
        if p.stem not in names:
            p.unlink()
