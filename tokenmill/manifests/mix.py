"""The training mix: a mix spec (YAML) planned over curation manifests.

Vocabulary: a **datamix** is what to curate (the curation config) and what curation made
of it (the curation manifest); a **training mix** is what a run reads from curated data:
which curated sources, in what proportion, for how many tokens, repeating small sources
up to a limit (Marin, for instance, repeats some data up to 7 times and schedules weights
by step). This module turns a **mix spec** into a **training-mix manifest** that the loader
(:mod:`tokenmill.train.data`) and the modded-nanogpt exporter
(:mod:`tokenmill.manifests.export`, the modded-nanogpt export) follow exactly.

Mix spec (YAML; paths relative to the spec file)::

    name: quickstart-mix
    manifests: [../out/quickstart/manifest.json]   # one or more curation manifests
    target_tokens: 20_000_000                       # token budget of the run
    seed: 1234
    on_shortfall: shrink        # shrink (default): a short source lowers the total;
                                # redistribute: the others grow (within their caps)
    sources:                    # mix name -> weight, max epochs; order is kept
      c4: {source: c4-en-sample, weight: 0.5, max_epochs: 1}
      wiki: {source: wikipedia-wikitext-sample, weight: 0.3, max_epochs: 7}
      books: {source: books-public-domain, manifest: quickstart, weight: 0.2}
    schedule:                   # optional: piecewise-constant weights from `at` on
      unit: tokens              # or steps (then tokens_per_step is required)
      points:
        - {at: 10_000_000, weights: {c4: 0.3, wiki: 0.5}}   # unlisted keep their weight

Planning (:func:`plan_mix`): weights are normalized per schedule segment; a source's
requested tokens are the sum over segments of segment length x weight; its cap is
``available train tokens x max_epochs``. A source whose request exceeds its cap is
granted the cap and a warning states the shortfall (never silent clipping); with
``shrink`` the total budget falls by the shortfall, with ``redistribute`` the other
sources are scaled up by one common factor (water-filling, each within its own cap).
Each source's per-segment tokens are scaled by its grant/request, which gives the
effective per-segment weights the loader realizes. Sources granted less than one epoch
use a document-aligned prefix of each of their shards (the same fraction of each), so
the manifest's token ranges are exactly what a trainer may read.

The training-mix manifest is JSON (sorted keys, no timestamps, paths relative to
its own folder): same inputs, same bytes. It carries the sha256 of each curation
manifest, shard and sidecar it references, and of the spec.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tokenmill import boundedyaml, objectcache, storage
from tokenmill.atomic import sha256_bytes, sha256_file
from tokenmill.errors import error_lines
from tokenmill.manifests.mixschema import (
    MIX_SCHEMA_VERSION,
    CurationRef,
    MixSegment,
    MixShard,
    MixSource,
    TrainingMixManifest,
    load_mix_manifest,
)
from tokenmill.manifests.schema import (
    MANIFEST_KINDS,
    DatamixManifest,
    ShardEntry,
    SourceEntry,
    manifest_kind,
)
from tokenmill.manifests.shards import read_sidecar
from tokenmill.manifests.verify import OpenedShards, open_shards
from tokenmill.tokenizers import TokenizerMismatchError, same_tokenizer

__all__ = [  # the training-mix manifest's models live in mixschema; re-exported here
    "MIX_SCHEMA_VERSION", "CurationRef", "MixPlan", "MixSegment", "MixShard", "MixSource",
    "MixSourceSpec", "MixSpec", "SchedulePoint", "ScheduleSpec", "TrainingMixManifest",
    "build_mix", "load_mix_manifest", "load_spec", "plan_mix", "plan_spec_file", "plan_table",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- spec


class MixSourceSpec(_Model):
    """One source of a mix spec: which curated source, its weight, how often it may repeat."""

    source: str | None = Field(default=None, description="curation source name (default: key)")
    manifest: str | None = Field(
        default=None, description="curation manifest name or path, when the name is ambiguous")
    weight: float = Field(ge=0.0, description="mixture weight (normalized over sources)")
    max_epochs: float = Field(default=1.0, gt=0.0, description="max passes over the source")


class SchedulePoint(_Model):
    """From ``at`` on, these weights hold (until the next point)."""

    at: int = Field(gt=0, description="token count (or step) from which these weights hold")
    weights: dict[str, float] = Field(
        description="new weight per mix source name from `at` on; unlisted sources keep their "
        "weight")


class ScheduleSpec(_Model):
    """Piecewise-constant source weights over the run."""

    unit: Literal["tokens", "steps"] = Field(
        default="tokens",
        description="what points' `at` counts: tokens or optimizer steps")
    tokens_per_step: int | None = Field(
        default=None, gt=0,
        description="tokens per step (required with unit: steps)")
    points: list[SchedulePoint] = Field(description="weight changes, at strictly increasing `at`")

    @model_validator(mode="after")
    def _check(self) -> ScheduleSpec:
        if self.unit == "steps" and not self.tokens_per_step:
            raise ValueError("schedule.unit 'steps' needs schedule.tokens_per_step")
        ats = [p.at for p in self.points]
        if ats != sorted(set(ats)):
            raise ValueError(f"schedule points must have strictly increasing `at`, got {ats}")
        return self


class MixSpec(_Model):
    """A mix spec: which curated sources a run trains on, in what proportion, for how many
    tokens, repeating small sources up to ``max_epochs``."""

    name: str = Field(description="the training mix's name")
    manifests: list[str] = Field(
        min_length=1,
        description="curation manifests (manifest.json or its folder) the sources come from, "
        "relative to the spec, or URLs")
    target_tokens: int = Field(
        gt=0,
        description="token budget of the run (training tokens, EOT included)")
    seed: int = Field(default=0, description="seed of the loader's document order and row shuffle")
    on_shortfall: Literal["shrink", "redistribute"] = Field(
        default="shrink",
        description="a source capped by its tokens x max_epochs: shrink lowers the total; "
        "redistribute grows the others within their caps")
    sources: dict[str, MixSourceSpec] = Field(
        min_length=1,
        description="mix name -> source and weight; the order is kept")
    schedule: ScheduleSpec | None = Field(
        default=None,
        description="piecewise-constant weights over the run; none: the sources' weights "
        "throughout")

    @model_validator(mode="after")
    def _check(self) -> MixSpec:
        if sum(s.weight for s in self.sources.values()) <= 0:
            raise ValueError("mix spec: all source weights are 0")
        for p in self.schedule.points if self.schedule else []:
            unknown = sorted(set(p.weights) - set(self.sources))
            if unknown:
                raise ValueError(f"schedule point at {p.at}: unknown sources {unknown}; "
                                 f"known: {list(self.sources)}")
        return self


def load_spec(path: str | os.PathLike) -> MixSpec:
    """Read a mix spec YAML file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file, at most three lines: not YAML (one line, with the
            line and column), a manifest given instead of a spec (its kind named), or the
            wrong fields by their path with what was expected (no pydantic dump).
    """
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    try:
        data = boundedyaml.load(text, str(p))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = getattr(e, "problem", None) or type(e).__name__
        raise ValueError(f"{p}: not a YAML mix spec{where}: {what}") from None
    if isinstance(data, dict) and ("schema_version" in data or "kind" in data
                                   or data.get("format") == "modded-nanogpt"):
        kind = MANIFEST_KINDS.get(manifest_kind(data), "a manifest")
        raise ValueError(f"{p}: this is {kind}, but a mix spec (YAML: name, manifests, "
                         "target_tokens, sources) is expected here")
    if not isinstance(data, dict):
        got = "empty" if data is None else f"a YAML {type(data).__name__}"
        raise ValueError(f"{p}: not a mix spec ({got}; expected a mapping with name, "
                         "manifests, target_tokens, sources)")
    try:
        return MixSpec.model_validate(data)
    except ValidationError as e:
        raise ValueError("\n".join(error_lines(f"{p}: invalid mix spec", e,
                                               MixSpec.model_fields))) from None


# ----------------------------------------------------------------------- planning


class MixPlan(_Model):
    """The result of :func:`plan_mix`: the manifest with paths relative to ``root``."""

    manifest: TrainingMixManifest
    root: str = Field(description="folder the manifest's relative paths are relative to")

    def table(self) -> str:
        return plan_table(self.manifest)


def _resolve_manifests(spec: MixSpec, base: Path, verify: bool
                       ) -> list[tuple[Path, DatamixManifest]]:
    """The spec's curation manifests, each opened through :func:`open_shards` (present,
    complete, every shard and sidecar checked; sha256 too with ``verify``)."""
    out = []
    for m in spec.manifests:
        p: str | Path = m if storage.is_url(m) else Path(m)
        p = p if storage.is_url(p) or Path(p).is_absolute() else base / p
        opened = open_shards(p, None, kind="curation", verify=verify)
        out.append((opened.manifest_path, opened.manifest))
    first_path, first = out[0]
    for p, m in out[1:]:
        if not same_tokenizer(m.tokenizer, first.tokenizer):
            raise TokenizerMismatchError(
                f"curation manifests use different tokenizers: {first_path} has "
                f"{first.tokenizer.short()} but {p} has {m.tokenizer.short()}; "
                "a training mix needs one tokenizer identity")
    return out


def _find_source(key: str, s: MixSourceSpec, mans: list[tuple[Path, DatamixManifest]]):
    want = s.source or key
    hits = []
    for i, (p, m) in enumerate(mans):
        names = (m.name, str(p), p.name, p.parent.name, objectcache.shown(p),
                 objectcache.shown(p.parent))  # a manifest in a bucket by its URL too
        if s.manifest is not None and s.manifest not in names:
            continue
        hits += [(i, src) for src in m.sources if src.name == want]
    if not hits:
        known = sorted({f"{m.name}:{src.name}" for _, m in mans for src in m.sources})
        raise ValueError(f"mix source {key!r}: no curation source named {want!r}"
                         f"{' in manifest ' + repr(s.manifest) if s.manifest else ''}; "
                         f"known: {known}")
    if len(hits) > 1:
        raise ValueError(f"mix source {key!r}: {want!r} is in several manifests "
                         f"({[mans[i][1].name for i, _ in hits]}); set `manifest:`")
    return hits[0]


def _segments(spec: MixSpec) -> list[tuple[int, int, dict[str, float]]]:
    """(start, length, normalized weights) per schedule segment, in tokens."""
    w = {k: s.weight for k, s in spec.sources.items()}
    bounds: list[tuple[int, dict[str, float]]] = [(0, dict(w))]
    if spec.schedule:
        scale = spec.schedule.tokens_per_step if spec.schedule.unit == "steps" else 1
        for p in spec.schedule.points:
            w = {**w, **p.weights}
            at = p.at * scale
            if at >= spec.target_tokens:
                break
            bounds.append((at, dict(w)))
    segs = []
    for j, (start, ws) in enumerate(bounds):
        end = bounds[j + 1][0] if j + 1 < len(bounds) else spec.target_tokens
        total = sum(ws.values())
        if total <= 0:
            raise ValueError(f"mix spec: all weights are 0 in the segment starting at {start}")
        segs.append((start, end - start, {k: v / total for k, v in ws.items()}))
    return segs


def _water_fill(req: np.ndarray, cap: np.ndarray, target: float) -> np.ndarray:
    """Grants g_i = min(cap_i, lam * req_i) with sum g = target (or all capped)."""
    if cap.sum() <= target:
        return cap.copy()
    lo, hi = 0.0, 1.0
    while np.minimum(cap, hi * req).sum() < target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.minimum(cap, mid * req).sum() < target:
            lo = mid
        else:
            hi = mid
    return np.minimum(cap, hi * req)


def _round_keeping_sum(x: np.ndarray) -> np.ndarray:
    """Integers with the same (rounded) sum: floor, then +1 on the largest remainders
    (largest-remainder method; ties to the earlier source)."""
    fl = np.floor(x + 1e-9)
    k = int(round(float(x.sum()))) - int(fl.sum())
    if k > 0:
        order = np.argsort(-(x - fl), kind="stable")[:k]
        fl[order] += 1
    return fl


def _ranges(shards: list[ShardEntry], folder: Path, frac: float) -> list[tuple[int, int, int]]:
    """(start, end, documents) per shard: all of it, or a document-aligned prefix of
    ``frac`` of its tokens (at least one document)."""
    out = []
    for s in shards:
        if frac >= 1.0:
            out.append((0, s.tokens, s.documents))
            continue
        side = read_sidecar(folder / s.path)
        off = side.column("offset").to_numpy().astype(np.int64)
        n = side.column("n_tokens").to_numpy().astype(np.int64)
        ends = off + n
        want = math.ceil(frac * s.tokens)
        k = int(np.searchsorted(ends, want, side="left")) + 1
        k = max(1, min(k, len(ends)))
        out.append((0, int(ends[k - 1]), k))
    return out


@dataclass
class _Grants:
    """Per source (spec order): requested tokens per segment, requested total, cap and
    granted tokens, and the total; the arithmetic of :func:`plan_mix`."""

    req_seg: np.ndarray
    req: np.ndarray
    avail: np.ndarray
    cap: np.ndarray
    grant: np.ndarray
    total: float


def _grants(spec: MixSpec, keys: list[str], avail: np.ndarray,
            segs: list[tuple[int, int, dict[str, float]]]) -> _Grants:
    """Requests from the segment weights, caps from max_epochs, grants by the
    ``on_shortfall`` rule (rounded to integers keeping the sum)."""
    req_seg = np.array([[seg[2][k] * seg[1] for k in keys] for seg in segs], dtype=np.float64)
    req = req_seg.sum(axis=0)
    for k, a, r in zip(keys, avail, req, strict=True):
        if r > 0 and a <= 0:
            raise ValueError(f"mix source {k!r} has weight > 0 but no train tokens")
    cap = np.floor(avail * np.array([spec.sources[k].max_epochs for k in keys]))
    if spec.on_shortfall == "shrink":
        grant = np.minimum(req, cap)
    else:
        grant = _water_fill(req, cap, float(spec.target_tokens))
    grant = _round_keeping_sum(grant)
    return _Grants(req_seg=req_seg, req=req, avail=avail, cap=cap, grant=grant,
                   total=float(grant.sum()))


def _shortfall_warnings(spec: MixSpec, keys: list[str], g: _Grants) -> list[str]:
    """One warning per source granted less than it requested, plus the total's."""
    warnings = []
    req_total = float(g.req.sum())
    for i, k in enumerate(keys):
        short = g.req[i] - g.grant[i]
        if short > 0.5:
            warnings.append(
                f"source {k!r} runs out before its weight is met: needs {g.req[i]:,.0f} "
                f"tokens ({g.req[i] / g.avail[i]:.3f} epochs) but has {g.avail[i]:,.0f} tokens "
                f"x max_epochs {spec.sources[k].max_epochs:g} = {g.cap[i]:,.0f}; shortfall "
                f"{short:,.0f} tokens ({100 * short / req_total:.2f}% of the "
                f"{spec.target_tokens:,} token budget); effective share "
                f"{100 * g.grant[i] / g.total:.2f}% instead of {100 * g.req[i] / req_total:.2f}%")
    if spec.on_shortfall == "shrink" and g.total < spec.target_tokens:
        if warnings:
            warnings.append(f"total tokens {g.total:,.0f} < target {spec.target_tokens:,} "
                            f"(on_shortfall: shrink)")
    elif g.total < spec.target_tokens:
        warnings.append(f"every source is capped: total tokens {g.total:,.0f} < target "
                        f"{spec.target_tokens:,}")
    return warnings


def _mix_segments(keys: list[str], g: _Grants) -> list[MixSegment]:
    """Effective per-segment weights: each source's segment requests scaled by its
    grant / request; segment lengths follow, the last one ends at the total."""
    scale = np.divide(g.grant, g.req, out=np.zeros_like(g.grant), where=g.req > 0)
    g_seg = g.req_seg * scale[None, :]
    segments = []
    pos = 0
    for j in range(g_seg.shape[0]):
        length = float(g_seg[j].sum())
        if length <= 0:
            continue
        ws = {k: float(g_seg[j, i] / length) for i, k in enumerate(keys)}
        n = int(round(length))
        segments.append(MixSegment(start_token=pos, tokens=n, weights=ws))
        pos += n
    if segments:  # rounding: the last segment ends at the total
        segments[-1].tokens = int(g.total) - segments[-1].start_token
    return segments


def _mix_shards(src: SourceEntry, folder: Path, root: Path, frac: float) -> list[MixShard]:
    """The source's train shards (a ``frac`` prefix of each when < 1) and val shards."""
    entries = []
    for split, fr in (("train", frac), ("val", 1.0)):
        shards = [s for s in src.shards if s.split == split]
        for s, (a, b, nd) in zip(shards, _ranges(shards, folder, fr), strict=True):
            entries.append(MixShard(
                path=objectcache.relative(folder / s.path, root), split=split, version=s.version,
                tokens=s.tokens, documents=s.documents, sha256=s.sha256,
                sidecar_sha256=s.sidecar_sha256, start=a, end=b, range_tokens=b - a,
                range_documents=nd))
    return entries


def _mix_source(spec: MixSpec, k: str, i: int, mi: int, src: SourceEntry, folder: Path,
                root: Path, g: _Grants, w0: float) -> MixSource:
    avail, req, grant = g.avail[i], g.req[i], g.grant[i]
    frac = grant / avail if avail > 0 else 0.0
    entries = _mix_shards(src, folder, root, frac)
    return MixSource(
        name=k, manifest=mi, source=src.name, weight=float(w0),
        requested_share=float(req / g.req.sum()), max_epochs=spec.sources[k].max_epochs,
        available_tokens=int(avail), available_documents=src.documents.get("train", 0),
        requested_tokens=int(round(req)),
        epochs_needed=float(req / avail) if avail > 0 else 0.0,
        granted_tokens=int(grant), epochs=float(frac),
        effective_weight=float(grant / g.total) if g.total else 0.0,
        shortfall_tokens=int(round(max(0.0, req - grant))),
        shards=[e for e in entries if e.split == "train"],
        val_shards=[e for e in entries if e.split == "val"])


def plan_mix(spec: MixSpec, spec_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None,
             verify: bool = True) -> MixPlan:
    """Plan a training mix (the rules are in the module docstring).

    Args:
        spec: the mix spec; its manifest paths are relative to ``spec_dir``.
        out_dir: folder the training manifest will live in (paths are made relative to
            it); default ``spec_dir``.
        verify: compare the sha256 of every shard and sidecar with its curation manifest
            (:func:`tokenmill.manifests.verify.open_shards`); ``False`` skips only the
            hashing, presence and headers are always checked.

    Raises:
        TokenizerMismatchError: the curation manifests use different tokenizers (names both).
        ShardVerifyError: a curation manifest is missing, of the wrong kind or invalid, or
            one of its shards is missing, truncated or (``verify``) differs.
        ValueError: an unknown or ambiguous source, or a source with no train tokens but
            a positive weight.
    """
    base = Path(spec_dir).resolve()
    root = Path(out_dir).resolve() if out_dir is not None else base
    mans = _resolve_manifests(spec, base, verify)
    keys = list(spec.sources)
    resolved = [_find_source(k, spec.sources[k], mans) for k in keys]
    avail = np.array([src.tokens.get("train", 0) for _, src in resolved], dtype=np.float64)
    segs = _segments(spec)
    g = _grants(spec, keys, avail, segs)
    refs = [CurationRef(name=m.name, path=objectcache.relative(p, root), sha256=sha256_file(p))
            for p, m in mans]
    sources = [_mix_source(spec, k, i, mi, src, mans[mi][0].parent, root, g, segs[0][2][k])
               for i, (k, (mi, src)) in enumerate(zip(keys, resolved, strict=True))]
    spec_json = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    manifest = TrainingMixManifest(
        name=spec.name, spec=spec.model_dump(mode="json"),
        spec_sha256=sha256_bytes(spec_json.encode()), seed=spec.seed,
        target_tokens=spec.target_tokens, total_tokens=int(g.total),
        tokenizer=mans[0][1].tokenizer, curation_manifests=refs, sources=sources,
        segments=_mix_segments(keys, g), warnings=_shortfall_warnings(spec, keys, g))
    return MixPlan(manifest=manifest, root=str(root))


def curation_mix(manifest: str | os.PathLike, seed: int = 0, epochs: float = 1.0,
                 verify: bool = True) -> tuple[TrainingMixManifest, Path]:
    """An in-memory training-mix manifest over a curation manifest: every source at its
    ``mixture_weight``, ``max_epochs=epochs``, a budget of all train tokens x ``epochs``,
    ``on_shortfall: shrink`` (so :func:`plan_mix`'s rules: each
    source granted at most ``epochs`` passes, document-aligned, no replacement).

    Returns:
        (the manifest, the folder its shard paths are relative to).

    Raises:
        ShardVerifyError: the curation manifest is missing, a training-mix manifest,
            invalid, or a shard is missing, truncated or (``verify``) differs.
        ValueError: no source has a positive weight and train tokens.
    """
    return plan_curation(open_shards(manifest, None, kind="curation", verify=verify),
                         seed=seed, epochs=epochs)


def plan_curation(opened: OpenedShards, seed: int = 0, epochs: float = 1.0
                  ) -> tuple[TrainingMixManifest, Path]:
    """:func:`curation_mix` of a curation manifest already opened (and checked) with
    :func:`~tokenmill.manifests.verify.open_shards`.

    Raises:
        ValueError: no source has a positive weight and train tokens.
    """
    m = opened.manifest
    avail = sum(s.tokens.get("train", 0) for s in m.sources)
    if avail <= 0 or not any(s.mixture_weight > 0 and s.tokens.get("train", 0) > 0
                             for s in m.sources):
        raise ValueError(f"{opened.manifest_path}: no source with train tokens and a "
                         "positive mixture weight")
    sources = {s.name: MixSourceSpec(source=s.name, weight=s.mixture_weight,
                                     max_epochs=epochs)
               for s in m.sources if s.tokens.get("train", 0) > 0}
    # the manifest by its name in its folder: the plan (and a loader state) does not
    # depend on where the folder lives
    spec = MixSpec(name=f"{m.name}-curation", manifests=[opened.manifest_path.name],
                   target_tokens=max(1, int(avail * epochs)), seed=seed, sources=sources)
    plan = plan_mix(spec, opened.root, verify=False)  # verified just above
    return plan.manifest, Path(plan.root)


def _local(where: str | os.PathLike) -> Path:
    """``where`` itself, or for a URL the path of its copy in this node's cache
    (:func:`tokenmill.objectcache.cache_path`)."""
    return objectcache.cache_path(str(where)) if storage.is_url(where) else Path(where)


def plan_spec_file(spec_path: str | os.PathLike, out_path: str | os.PathLike | None = None,
                   verify: bool = True) -> MixPlan:
    """:func:`plan_mix` for a spec file; paths relative to ``out_path``'s folder if given.
    Either may be a URL (the spec is downloaded; manifests it names relative to itself are
    then in its bucket).

    Raises:
        FileNotFoundError: no spec there. StorageError: its bucket cannot be read.
    """
    if storage.is_url(spec_path) and objectcache.fresh_copy(str(spec_path)) is None:
        raise FileNotFoundError(f"{storage.redact(str(spec_path))}: not found (a mix spec)")
    spec_path = _local(spec_path)
    out_dir = _local(out_path).resolve().parent if out_path is not None else None
    return plan_mix(load_spec(spec_path), spec_path.parent, out_dir=out_dir, verify=verify)


def build_mix(spec_path: str | os.PathLike, out_path: str | os.PathLike,
              verify: bool = True) -> TrainingMixManifest:
    """Plan ``spec_path`` and write the training-mix manifest to ``out_path`` atomically
    (a URL: written in this node's cache, then uploaded as one object, which a reader sees
    whole or not at all). Returns the manifest.

    Raises:
        StorageError: ``out_path``'s bucket is missing or refuses the write (one line
            naming the URL), checked before any shard is read.
    """
    if storage.is_url(out_path):
        storage.check_bucket(str(out_path))
    plan = plan_spec_file(spec_path, out_path, verify=verify)
    plan.manifest.write(_local(out_path))
    if storage.is_url(out_path):
        storage.upload(_local(out_path), str(out_path))
    return plan.manifest


#: plan table columns: (name, unit) — the unit is the header's second line
_PLAN_HEAD = (("source", ""), ("spec", "weight"), ("available", "tokens"),
              ("max", "epochs"), ("requested", "tokens"), ("requested", "share"),
              ("needed", "epochs"), ("granted", "tokens"), ("granted", "epochs"),
              ("effective", "share"), ("shortfall", "tokens"))


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _plan_rows(m: TrainingMixManifest) -> list[tuple[str, ...]]:
    """One row of strings per source, then the total row."""
    rows = []
    for s in m.sources:
        rows.append((s.name, _pct(s.weight), f"{s.available_tokens:,}", f"{s.max_epochs:g}",
                     f"{s.requested_tokens:,}", _pct(s.requested_share),
                     f"{s.epochs_needed:.3f}", f"{s.granted_tokens:,}", f"{s.epochs:.3f}",
                     _pct(s.effective_weight), f"{s.shortfall_tokens:,}"))
    rows.append(("total", _pct(sum(s.weight for s in m.sources)),
                 f"{sum(s.available_tokens for s in m.sources):,}", "",
                 f"{sum(s.requested_tokens for s in m.sources):,}", _pct(1.0), "",
                 f"{m.total_tokens:,}", "", _pct(1.0),
                 f"{sum(s.shortfall_tokens for s in m.sources):,}"))
    return rows


def _capped_note(m: TrainingMixManifest, s: MixSource) -> str:
    """Why a capped source's effective share is below its requested one."""
    rule = m.spec.get("on_shortfall", "shrink")
    return (f"{s.name}: {_pct(s.effective_weight)} instead of {_pct(s.requested_share)}: "
            f"capped at max_epochs {s.max_epochs:g} x {s.available_tokens:,} train tokens "
            f"= {s.granted_tokens:,} tokens, but its share of the target needs "
            f"{s.requested_tokens:,} ({s.epochs_needed:.3f} epochs); "
            + ("the total shrinks by the shortfall (on_shortfall: shrink)" if rule == "shrink"
               else "the uncapped sources take up the shortfall (on_shortfall: redistribute)"))


def _grown_note(m: TrainingMixManifest, s: MixSource, capped: list[str]) -> str:
    """Why an uncapped source's effective share differs from its requested one."""
    head = f"{s.name}: {_pct(s.effective_weight)} instead of {_pct(s.requested_share)}: "
    names = ", ".join(capped)
    if m.spec.get("on_shortfall", "shrink") == "shrink":
        return (head + f"all its {s.granted_tokens:,} requested tokens are granted, but the "
                f"total shrank to {m.total_tokens:,} because {names} ran short "
                "(on_shortfall: shrink), so each granted token is a larger share")
    factor = s.granted_tokens / s.requested_tokens if s.requested_tokens else 0.0
    at_cap = s.granted_tokens >= math.floor(s.available_tokens * s.max_epochs)
    how = f"granted x{factor:.3f} its request" + (
        f" (up to its cap, max_epochs {s.max_epochs:g})" if at_cap else "")
    return (head + f"{how}: the sources not capped were scaled up by one common factor "
            f"(water-filling) to fill the shortfall of {names} (on_shortfall: redistribute)")


def share_notes(m: TrainingMixManifest) -> list[str]:
    """One line per source whose shares, as the plan table prints them, differ: the spec's
    weight (normalized, at token 0) vs the requested share (a ``schedule`` changes the
    weights later on), and the requested share vs the effective one (a source capped by
    its ``max_epochs`` x available tokens, and what ``on_shortfall`` did about it)."""
    notes = []
    sched = m.spec.get("schedule")
    for s in m.sources:
        if _pct(s.weight) != _pct(s.requested_share) and sched:
            ats = ", ".join(f"{p['at']:,}" for p in sched.get("points", []))
            notes.append(f"{s.name}: requested {_pct(s.requested_share)} of the run, not the "
                         f"spec's {_pct(s.weight)}: the schedule changes the weights at "
                         f"{sched.get('unit', 'tokens')} {ats} ({len(m.segments)} segments)")
    capped = [s.name for s in m.sources if s.shortfall_tokens > 0]
    for s in m.sources:
        if _pct(s.requested_share) == _pct(s.effective_weight):
            continue
        notes.append(_capped_note(m, s) if s.shortfall_tokens > 0
                     else _grown_note(m, s, capped))
    return notes


def plan_table(m: TrainingMixManifest) -> str:
    """The plan as a text table, with a two-line header (name, then unit), thousands
    separators and shares in percent: per source the spec's weight, available train
    tokens, max epochs, requested tokens and share, epochs needed, granted tokens and
    epochs, effective share and shortfall; then the totals, a summary line, one line per
    share that differs from the spec's (:func:`share_notes`) and the warnings."""
    rows = [tuple(h[0] for h in _PLAN_HEAD), tuple(h[1] for h in _PLAN_HEAD), *_plan_rows(m)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(_PLAN_HEAD))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip())
        if j == 1 or j == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(f"target {m.target_tokens:,} tokens, tokenizer {m.tokenizer.short()}, "
                 f"seed {m.seed}, {len(m.segments)} schedule segment(s)")
    lines.append("shares: % of the tokens; epochs: passes over a source's train tokens")
    notes = share_notes(m)
    if notes:
        lines += ["", "why shares differ from the spec:"] + [f"  {n}" for n in notes]
    lines += [f"WARNING: {w}" for w in m.warnings]
    return "\n".join(lines)
