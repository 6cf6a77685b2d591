"""Exports: a training mix as the files another trainer reads, exactly the loader's tokens.

``tokenmill shards export --format FORMAT MIX.json -o OUT`` writes, by format:

* ``modded-nanogpt``: ``fineweb_train_000001.bin ...`` (the mixture) and
  ``fineweb_val_000000.bin ...`` (all val documents) in modded-nanogpt's layout: a
  256-int32 header (magic 20240520, version 1, token count) and uint16 tokens, which its
  ``_load_data_shard`` reads unchanged (it asserts version 1, so only vocabularies up to
  65,536 ids, such as GPT-2, can be exported; a wider one is refused, naming
  ``--format megatron``). A ``*.docs.parquet`` sidecar (offset, n_tokens, key, source,
  doc_offset) sits beside each shard (modded-nanogpt ignores it).
* ``megatron``: Megatron-LM / NeMo indexed datasets (:mod:`tokenmill.manifests.export_formats`).
* ``olmo``: the Dolma tokenizer layout OLMo reads.
* ``hf``: a Hugging Face parquet dataset of ``input_ids`` with a dataset card.

Every format holds the sequences of :mod:`tokenmill.manifests.export_plan`: the train
stream is **exactly the token stream** :class:`tokenmill.train.data.MixLoader` yields for
the same manifest, seed, ``seq_len``, global ``batch_size`` and ``remainder`` (defaults
2048, 1, carry), one sequence per piece (each starts with EOT), and every val document,
whole. Every prefix of the train stream honours the mixture to within one row. Same
manifest and options, same bytes.

``export.json`` lists every file with its sha256, the mix identity
(:func:`~tokenmill.manifests.mixschema.mix_identity_sha256`), the loader settings, the
tokenizer, per-source train tokens, and per split the format-independent digests of its
tokens and sequence lengths, which ``tokenmill export verify`` recomputes from the files
(:mod:`tokenmill.manifests.export_verify`).

An output folder may be a URL (``s3://``, ``gs://``): the export is written in a fresh
folder of this node's staging area, then uploaded with ``export.json`` last (the previous
one removed first), so a reader that finds ``export.json`` finds every file it lists; files
the previous export listed and this one does not are then deleted.

Before anything is written, every shard and sidecar the manifest lists is checked against
it (:func:`tokenmill.manifests.export_plan.open_mix`): a stale or truncated shard is refused,
naming the files; ``verify=False`` (``--no-verify``) skips only the sha256 comparison.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokenmill import objectcache, storage
from tokenmill.atomic import atomic_write_text, sha256_file
from tokenmill.manifests.export_plan import (
    DEFAULT_SEQ_LEN,
    DEFAULT_SHARD_TOKENS,
    Chunk,
    LoaderSettings,
    StreamDigest,
    open_mix,
    per_source,
    split_streams,
)
from tokenmill.manifests.mixschema import TrainingMixManifest, mix_identity_sha256
from tokenmill.manifests.shards import VERSION_UINT16, version_for_vocab, write_shard

FORMATS = ("modded-nanogpt", "megatron", "olmo", "hf")
EXPORT_FILE = "export.json"
EXPORT_SCHEMA_VERSION = 1

__all__ = ["DEFAULT_SEQ_LEN", "DEFAULT_SHARD_TOKENS", "EXPORT_FILE", "FORMATS", "export_mix",
           "export_modded_nanogpt"]


class ModdedNanoGPTWriter:
    """``fineweb_{split}_{c:06d}.bin`` shards (+ sidecars): val is shard 000000 on, train
    starts at 000001, as modded-nanogpt names them."""

    def __init__(self, out: Path, m: TrainingMixManifest, settings: LoaderSettings) -> None:
        if version_for_vocab(m.tokenizer.n_vocab) != VERSION_UINT16:
            raise ValueError(
                f"tokenizer {m.tokenizer.short()} has {m.tokenizer.n_vocab} ids; "
                "modded-nanogpt reads uint16 tokens only: use --format megatron "
                "(or olmo, hf) for this vocabulary")
        self.out = out

    def write_split(self, split: str, chunks, log) -> list[dict]:
        files = []
        for c, ch in enumerate(chunks):
            path = self.out / f"fineweb_{split}_{(1 if split == 'train' else 0) + c:06d}.bin"
            write_shard(path, ch.tokens.astype(np.uint16), VERSION_UINT16,
                        ch.offsets.astype(np.uint64), ch.keys, extra_columns={
                            "source": pa.array(ch.sources, pa.string()),
                            "doc_offset": pa.array(ch.doc_offsets, pa.uint64())})
            files.append({"path": path.name, "split": split, "tokens": int(ch.tokens.size),
                          "documents": len(ch.keys), "sha256": sha256_file(path)})
            files.append({"path": path.name[:-4] + ".docs.parquet", "split": split,
                          "role": "sidecar", "sha256": sha256_file(
                              path.with_name(path.name[:-4] + ".docs.parquet"))})
            log(f"wrote {path} ({ch.tokens.size:,} tokens, {len(ch.keys)} documents)")
        return files

    def finish(self, summary: dict) -> list[dict]:
        return []


def _writer(fmt: str, out: Path, m: TrainingMixManifest, settings: LoaderSettings):
    if fmt == "modded-nanogpt":
        return ModdedNanoGPTWriter(out, m, settings)
    from tokenmill.manifests import export_formats

    writers = {"megatron": export_formats.MegatronWriter, "olmo": export_formats.OlmoWriter,
               "hf": export_formats.HfWriter}
    if fmt not in writers:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    return writers[fmt](out, m, settings)


def _digested(chunks, digest: StreamDigest):
    for ch in chunks:
        digest.update(ch.tokens, ch.lengths)
        yield ch


def export_mix(
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    fmt: str = "modded-nanogpt",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    splits: tuple[str, ...] = ("train", "val"),
    log=print,
    settings: LoaderSettings | None = None,
    verify: bool = True,
) -> dict:
    """Write a training mix under ``out_dir`` in format ``fmt`` (module docstring), plus
    ``export.json``.

    Args:
        manifest_path: a training-mix manifest (``tokenmill mix build``).
        fmt: one of :data:`FORMATS`.
        shard_tokens: most tokens per output file (sequence-aligned; a longer sequence
            gets a file of its own); Megatron writes one ``.bin`` per split regardless.
        settings: the loader settings whose stream the files hold (default: 2048, 1,
            carry, one sequence per document).
        verify: compare every shard's and sidecar's sha256 with the manifest first.

    Returns:
        The ``export.json`` content.

    Raises:
        ShardVerifyError: the manifest is missing or not a training mix, or a shard is
            missing, truncated or (``verify``) differs from the manifest (names them).
        ValueError: an unknown format or split, a vocabulary the format cannot hold (one
            line naming the format that can), or a loader check fails (see
            :func:`tokenmill.manifests.schedule.load_documents`).
    """
    settings = settings or LoaderSettings()
    if storage.is_url(out_dir):
        return _export_to_url(manifest_path, storage.normalize(out_dir), fmt, shard_tokens,
                              splits, log, settings, verify)
    bad = [s for s in splits if s not in ("train", "val")]
    if bad:
        raise ValueError(f"unknown split(s) {bad}; use train and/or val")
    opened = open_mix(manifest_path, verify=verify)
    m: TrainingMixManifest = opened.manifest
    out = Path(out_dir)
    writer = _writer(fmt, out, m, settings)  # refuses what the format cannot hold
    out.mkdir(parents=True, exist_ok=True)
    files, sources, streams = [], {}, {}
    for stream in split_streams(opened, splits, settings):
        if not len(stream.pieces.length):
            raise ValueError(f"{objectcache.shown(opened.manifest_path)}: its {stream.split} "
                             f"split fills no loader row of {settings.seq_len + 1} tokens "
                             f"(batch {settings.batch_size}): nothing to export")
        digest = StreamDigest()
        chunks = stream.chunks(shard_tokens, getattr(writer, "align_rows", False))
        files += writer.write_split(stream.split, _digested(chunks, digest), log)
        streams[stream.split] = digest.as_dict()
        if stream.split == "train":
            sources = per_source(m, stream.pieces)
    summary = {"schema_version": EXPORT_SCHEMA_VERSION, "format": fmt, "mix": m.name,
               # the mix's identity: listing side channels in it changes nothing exported
               "mix_manifest_sha256": mix_identity_sha256(opened.manifest_path),
               "loader": {"seq_len": settings.seq_len, "batch_size": settings.batch_size,
                          "remainder": settings.remainder, "verified": verify},
               "packed": settings.packed, "splits": list(splits),
               "tokenizer": m.tokenizer.model_dump(mode="json"), "files": files,
               "streams": streams, "sources": sources}
    summary["files"] += writer.finish(summary)
    stale = _previous_files(out / EXPORT_FILE) - {f["path"] for f in summary["files"]}
    atomic_write_text(out / EXPORT_FILE, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for rel in sorted(stale):  # a trainer globbing the folder must not read them
        (out / rel).unlink(missing_ok=True)
        log(f"removed {out / rel} (listed by the previous export in {out})")
    return summary


def _export_to_url(manifest_path: str | os.PathLike, url: str, fmt: str, shard_tokens: int,
                   splits: tuple[str, ...], log, settings: LoaderSettings, verify: bool
                   ) -> dict:
    """:func:`export_mix` into the bucket folder ``url``: written in a fresh local folder,
    uploaded with ``export.json`` last, then the previous export's files not listed again
    deleted (a reader globbing the folder must not take them)."""
    with storage.output_folder(url, EXPORT_FILE) as tmp:  # a missing bucket fails first
        previous = _previous_files(storage.join(url, EXPORT_FILE))
        shown = storage.redact(url)

        def log_at_url(line: str) -> None:  # the user asked for the bucket, not our staging
            log(line.replace(str(tmp), shown))

        summary = export_mix(manifest_path, tmp, fmt, shard_tokens, splits, log_at_url,
                             settings, verify)
    for rel in sorted(previous - {f["path"] for f in summary["files"]}):
        storage.remove(storage.join(url, rel))
        log(f"removed {storage.redact(storage.join(url, rel))} (listed by the previous "
            f"export in {storage.redact(url)})")
    return summary


def _previous_files(listing: str | os.PathLike) -> set[str]:
    """Files the export listing ``listing`` (a path or URL) names (none when there is
    none)."""
    try:
        listed = json.loads(storage.read_bytes(listing).decode("utf-8"))["files"]
        paths = {Path(f["path"]) for f in listed}
        return {p.as_posix() for p in paths if not p.is_absolute() and ".." not in p.parts}
    except (OSError, ValueError, KeyError, TypeError, storage.StorageError):
        return set()


def export_modded_nanogpt(
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    splits: tuple[str, ...] = ("train", "val"),
    log=print,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = 1,
    remainder: str = "carry",
    verify: bool = True,
) -> dict:
    """:func:`export_mix` in the modded-nanogpt format with loader settings ``seq_len``,
    ``batch_size`` (global rows), ``remainder``.

    Raises:
        as :func:`export_mix`; ValueError for a vocabulary over 65,536 ids.
    """
    return export_mix(manifest_path, out_dir, "modded-nanogpt", shard_tokens, splits, log,
                      LoaderSettings(seq_len, batch_size, remainder), verify)


def chunk_entry(path: Path, root: Path, split: str, ch: Chunk, **extra) -> dict:
    """An ``export.json`` file entry for a data file written from chunk ``ch``."""
    return {"path": path.relative_to(root).as_posix(), "split": split,
            "tokens": int(ch.tokens.size), "documents": len(ch.keys),
            "sha256": sha256_file(path), **extra}
