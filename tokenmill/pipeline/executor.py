"""The executor: plans units of work and chains the stages on Ray.

It only chains stages; what each stage does lives in :mod:`tokenmill.pipeline.units`.

Order of work for ``tokenmill run``:

1. resolve sources (local folders, Hub snapshots) and refuse disallowed licenses;
2. ``prepare`` tasks, one per unit (a data file, or up to ``files_per_block`` small
   files): read → per-document license gate → normalize, committed in blocks of
   ``block_documents`` rows (the granularity of resume);
   → length filters → quality filters → language id, plus per-document exact-dedup hash
   and MinHash signature;
3. dedup on the driver: exact (first occurrence in source, unit, row order wins) then
   MinHash-LSH fuzzy over the exact-unique documents (lowest key of a cluster kept);
4. ``tokenize`` tasks, one per block: drop duplicates → tokenize;
5. ``write`` tasks, one per source: shards, sidecars, quarantine;
6. the manifest, written last and atomically.

Every task's output is content-addressed by its inputs and versioned config, so the
result is byte-identical whatever the number of Ray workers, and a rerun reuses
finished units.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tokenmill.manifests.schema import (
    MANIFEST_NAME,
    DatamixManifest,
    QuarantineEntry,
    ShardEntry,
    SourceCounts,
    SourceEntry,
)
from tokenmill.pipeline import units
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.intermediate import content_hash
from tokenmill.pipeline.license import check_source_licenses
from tokenmill.pipeline.readers import is_whole_file
from tokenmill.manifests.shards import version_for_vocab
from tokenmill.pipeline.sources import ResolvedSource, resolve_sources
from tokenmill.tokenizers import identity

log = logging.getLogger(__name__)

PREPARE_VERSION = 4  # 4: readers detect JSON layouts, BOMs, separators → "\n" (issue 13)
TOKENIZE_VERSION = 2
WRITE_VERSION = 1


@dataclass
class Block:
    """Up to ``block_documents`` rows of a unit: the granularity of resume."""

    source: ResolvedSource
    prepare_digest: str
    prepare_info: dict[str, Any]
    tokenize_digest: str = ""
    tokenize_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Unit:
    source: ResolvedSource
    files: list[str]
    digest: str = ""


@dataclass
class RunResult:
    manifest_path: Path
    manifest: DatamixManifest
    seconds: float
    reused_units: int  # blocks whose prepare and tokenize outputs were both reused
    total_units: int  # blocks in all
    reused_prepare: int = 0
    reused_tokenize: int = 0
    recovered: list[str] = field(default_factory=list)  # corrupt intermediates recomputed


def _file_stat(root: Path, rel: str) -> list:
    """An input file's part of its unit's cache key: path, size and sha256 of its bytes
    (not the mtime: archives and copies keep or reset mtimes whatever the content)."""
    from tokenmill.atomic import sha256_file

    return [rel, (root / rel).stat().st_size, sha256_file(root / rel)]


def plan_units(cfg: DatamixConfig, sources: list[ResolvedSource]) -> list[Unit]:
    """Split every source into units: each row-format file alone; whole-file documents
    in groups of ``files_per_block``. The plan depends only on the file lists."""
    out = []
    for src in sources:
        whole = [f for f in src.files if is_whole_file(f)]
        rows = [f for f in src.files if not is_whole_file(f)]
        groups = [[f] for f in rows]
        groups += [whole[i : i + cfg.files_per_block]
                   for i in range(0, len(whole), cfg.files_per_block)]
        for files in sorted(groups):
            out.append(Unit(source=src, files=files))
    return out


def _init_ray(ray_address: str | None, num_cpus: int | None) -> bool:
    """Start an embedded local Ray (or join ``ray_address``). Returns True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    env = {k: os.environ[k] for k in ("TIKTOKEN_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE",
                                      "HF_HUB_OFFLINE") if k in os.environ}
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": False,
                              "configure_logging": False}
    if ray_address:
        ray.init(address=ray_address, **kwargs)
    else:
        # address="local": always a fresh embedded instance, even when a `ray start`
        # cluster on this machine would otherwise be joined implicitly
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count(),
                 include_dashboard=False, **kwargs)
    return True


def _run_tasks(fn, specs: list[dict], desc: str, show: bool) -> list[Any]:
    """Run ``fn`` over ``specs`` as Ray tasks with a progress bar; results in spec order."""
    import ray

    remote = ray.remote(max_retries=3, retry_exceptions=False)(fn)
    refs = [remote.remote(s) for s in specs]
    index = {r: i for i, r in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    with tqdm(total=len(refs), desc=desc, unit="unit", disable=not show) as bar:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                results[index[r]] = ray.get(r)
                bar.update(1)
    return results


def run_datamix(
    cfg: DatamixConfig, *, ray_address: str | None = None, num_cpus: int | None = None,
    progress: bool = True,
) -> RunResult:
    """Curate a datamix into shards + manifest under ``cfg.output_dir``.

    Raises:
        SourceError / LicenseError: before any work, naming the source (and license).
    """
    t0 = time.perf_counter()
    tok = identity(cfg.tokenizer)  # fails early when the tokenizer files are missing
    sources = resolve_sources(cfg)  # every unusable source in one error
    check_source_licenses(cfg, sources)
    out_dir = Path(cfg.output_dir).resolve()
    work = out_dir / "work"
    plan = plan_units(cfg, sources)
    started = _init_ray(ray_address, num_cpus)
    try:
        return _execute(cfg, tok, sources, plan, out_dir, work, progress, t0)
    finally:
        if started:
            import ray

            ray.shutdown()


def _execute(cfg, tok, sources, plan, out_dir, work, progress, t0) -> RunResult:
    prepare_specs = []
    for u in plan:
        sc = u.source.config
        params = {
            "v": PREPARE_VERSION, "source": u.source.name, "text_field": sc.text_field,
            "max_document_bytes": cfg.max_document_bytes, "limit": sc.max_documents,
            "document_license": sc.document_license,
            "deny_terms": sorted(cfg.licenses.document_deny_terms),
            "block_documents": cfg.block_documents,
            "filters": cfg.filters.model_dump(),
            "quality": cfg.quality.model_dump() if cfg.quality else None,
            "apply_quality": sc.quality_filters,
            "language": cfg.language.model_dump() if cfg.language else None,
            "fuzzy": cfg.fuzzy_dedup.model_dump() if cfg.fuzzy_dedup else None,
        }
        u.digest = content_hash("prepare", params, [_file_stat(u.source.root, f) for f in u.files])
        prepare_specs.append(params | {
            "work": str(work), "digest": u.digest, "root": str(u.source.root),
            "files": u.files})
    per_unit = _run_tasks(units.prepare_unit, prepare_specs, "read+normalize", progress)
    blocks = [Block(source=u.source, prepare_digest=b["digest"], prepare_info=b["info"])
              for u, bl in zip(plan, per_unit, strict=True) for b in bl]

    dups_by_block, fuzzy = _deduplicate(cfg, blocks, work, progress)

    tokenize_specs = []
    for b, dups in zip(blocks, dups_by_block, strict=True):
        params = {"v": TOKENIZE_VERSION, "tokenizer": tok.model_dump(),
                  "val_fraction": cfg.shards.val_fraction}
        b.tokenize_digest = content_hash("tokenize", params, b.prepare_digest,
                                         sorted(dups.items()))
        tokenize_specs.append({
            "work": str(work), "digest": b.tokenize_digest, "prepare_digest": b.prepare_digest,
            "source": b.source.name, "duplicates": dups,
            "tokenizer": cfg.tokenizer, "val_fraction": cfg.shards.val_fraction})
    infos = _run_tasks(units.tokenize_unit, tokenize_specs, "tokenize", progress)
    for b, info in zip(blocks, infos, strict=True):
        b.tokenize_info = info

    # From here the shards change: a manifest of an earlier run must not sit beside them
    # (a crash now leaves no manifest, never a manifest that lies).
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    _remove_stale_sources(out_dir, {s.name for s in sources})
    shard_version = version_for_vocab(tok.n_vocab)
    write_specs = []
    for src in sources:
        write_specs.append({
            "work": str(work), "output_dir": str(out_dir), "source": src.name,
            "units": [(b.prepare_digest, b.tokenize_digest) for b in blocks if b.source is src],
            "tokens_per_shard": cfg.shards.tokens_per_shard, "shard_version": shard_version})
    written = _run_tasks(units.write_source, write_specs, "write shards", progress)

    manifest = _manifest(cfg, tok, sources, blocks, written, fuzzy)
    path = manifest.write(out_dir)
    reused = sum(1 for b in blocks if b.prepare_info.get("reused") and
                 b.tokenize_info.get("reused"))
    res = RunResult(path, manifest, time.perf_counter() - t0, reused, len(blocks))
    res.reused_prepare = sum(1 for b in blocks if b.prepare_info.get("reused"))
    res.reused_tokenize = sum(1 for b in blocks if b.tokenize_info.get("reused"))
    res.recovered = sorted({p for b in blocks for p in b.prepare_info.get("recovered", []) +
                            b.tokenize_info.get("recovered", [])})
    for p in res.recovered:
        log.warning("recomputed a corrupt or incomplete intermediate: %s", p)
    return res


def _remove_stale_sources(out_dir: Path, names: set[str]) -> None:
    """Shards and quarantine files of sources this datamix no longer has are deleted, so
    that a glob over ``shards/`` (as modded-nanogpt's loader does) finds only this run's."""
    for p in sorted((out_dir / "shards").glob("*")):
        if p.is_dir() and p.name not in names:
            log.warning("removing shards of a source no longer in the datamix: %s", p)
            shutil.rmtree(p)
    for p in sorted((out_dir / "quarantine").glob("*.parquet")):
        if p.stem not in names:
            p.unlink()


def _deduplicate(cfg, blocks, work, progress) -> tuple[list[dict[str, list]], dict | None]:
    """Global dedup on the driver. Exact: the first occurrence in (source, unit, row) order
    of a normalized text wins (holds 16 bytes + key per document). Fuzzy (when configured):
    MinHash-LSH over the exact-unique documents' signatures, computed per block by the
    workers (holds num_perm * 4 bytes + key per document); the lowest key of a cluster is
    kept. Returns per block {removed key: [kept key, stage, detail]} and the fuzzy record.
    """
    first: dict[bytes, str] = {}
    dups: list[dict[str, list]] = []
    for b in tqdm(blocks, desc="exact dedup", unit="block", disable=not progress):
        keys, hashes = units.read_dedup_keys(str(work), b.prepare_digest)
        d = {}
        for k, h in zip(keys, hashes, strict=True):
            kept = first.setdefault(h, k)
            if kept != k:
                d[k] = [kept, "exact_dedup", None]
        dups.append(d)
    del first
    if cfg.fuzzy_dedup is None:
        return dups, None
    from tokenmill.pipeline.minhash import fuzzy_dedup_signatures

    f = cfg.fuzzy_dedup
    keys_all, sigs, counts, owner = [], [], [], {}
    for i, b in enumerate(tqdm(blocks, desc="fuzzy dedup", unit="block",
                               disable=not progress)):
        keys, _ = units.read_dedup_keys(str(work), b.prepare_digest)
        sig, nsh = units.read_signatures(str(work), b.prepare_digest, f.num_perm)
        keep = [j for j, k in enumerate(keys) if k not in dups[i]]
        keys_all += [keys[j] for j in keep]
        sigs.append(sig[keep])
        counts.append(nsh[keep])
        owner.update({keys[j]: i for j in keep})
    import numpy as np

    sig = np.concatenate(sigs) if sigs else np.empty((0, f.num_perm), np.uint32)
    nsh = np.concatenate(counts) if counts else np.empty(0, np.int64)
    res = fuzzy_dedup_signatures(keys_all, sig, nsh, threshold=f.threshold, ngram=f.ngram,
                                 seed=f.seed)
    for key, (kept, jac) in sorted(res.removed.items()):
        dups[owner[key]][key] = [kept, "fuzzy_dedup", f"jaccard={jac:.3f}"]
    # an exact duplicate of a document that fuzzy dedup then removed points to the
    # document actually kept (its text equals the removed one's, so it is as similar)
    for d in dups:
        for entry in d.values():
            if entry[1] == "exact_dedup" and entry[0] in res.removed:
                entry[2] = f"same text as {entry[0]}"
                entry[0] = res.removed[entry[0]][0]
    counters = {k: v for k, v in res.counters.items() if k != "seconds"}
    sizes = res.cluster_sizes
    record = {"params": res.params, "counters": counters,
              "cluster_sizes": {str(s): sizes.count(s) for s in sorted(set(sizes))}}
    return dups, record


def _manifest(cfg, tok, sources, blocks, written, fuzzy) -> DatamixManifest:
    entries = []
    q_entries = []
    for src, w in zip(sources, written, strict=True):
        mine = [b for b in blocks if b.source is src]
        quarantined: Counter = Counter()
        lic_rej: Counter = Counter()
        lic_acc: Counter = Counter()
        filtered: Counter = Counter()
        read = dups = near = kept = read_errors = 0
        stage_stats: dict[str, dict[str, Any]] = {}
        for b in mine:
            p, t = b.prepare_info, b.tokenize_info
            read += p["read"]
            quarantined.update(p["read_rejected"])
            read_errors += sum(p["read_rejected"].values())
            quarantined.update(p["normalize_rejected"])
            lic_rej.update({k.removeprefix("license:"): v
                            for k, v in p["license_rejected"].items()})
            lic_acc.update(p["license_accepted"])
            filtered.update(p["filtered"])
            dups += t["exact_duplicates"]
            near += t["near_duplicates"]
            kept += t["kept"]
            for name, st in p["stages"].items():
                agg = stage_stats.setdefault(name, {"docs_in": 0, "docs_out": 0,
                                                    "rejected": Counter()})
                agg["docs_in"] += st["docs_in"]
                agg["docs_out"] += st["docs_out"]
                agg["rejected"].update(st["rejected"])
        shards = [ShardEntry(**s) for s in w["shards"]]
        counts = SourceCounts(read=read, quarantined=dict(sorted(quarantined.items())),
                              license_rejected=dict(sorted(lic_rej.items())),
                              exact_duplicates=dups, near_duplicates=near,
                              filtered=dict(sorted(filtered.items())), kept=kept)
        assert counts.read == counts.kept + counts.removed(), f"count mismatch for {src.name}"
        entries.append(SourceEntry(
            name=src.name, origin=src.origin, revision=src.revision, license=src.license,
            mixture_weight=src.config.weight, counts=counts,
            license_accepted=dict(sorted(lic_acc.items())),
            tokens={s: sum(x.tokens for x in shards if x.split == s) for s in ("train", "val")},
            documents={s: sum(x.documents for x in shards if x.split == s)
                       for s in ("train", "val")},
            shards=shards, skipped_files=src.skipped_files,
            stages={"read": {"rows": read}, "read_errors": {"removed": read_errors},
                    **{n: {"docs_in": v["docs_in"], "docs_out": v["docs_out"],
                           "rejected": dict(sorted(v["rejected"].items()))}
                       for n, v in stage_stats.items()},
                    "exact_dedup": {"removed": dups}, "fuzzy_dedup": {"removed": near}},
        ))
        q_entries.append(QuarantineEntry(**w["quarantine"]))
    return DatamixManifest(name=cfg.name, config=cfg.content_dict(), config_sha256=cfg.sha256(),
                           tokenizer=tok, sources=entries, quarantine=q_entries,
                           fuzzy_dedup=fuzzy)
