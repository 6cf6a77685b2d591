"""``tokenmill export verify DIR``: read an export back, whatever its format, and check it.

Checks, in order (each problem is one line naming the file):

1. ``DIR/export.json`` exists and is an export listing (:mod:`tokenmill.manifests.export`).
2. Every file it lists exists with the listed sha256, and no other file lies where the
   format's trainer looks for data (:data:`TRAINER_GLOBS`).
3. Every split is read back through the format's own layout (modded-nanogpt shard headers
   and sidecars; Megatron's ``.idx`` header, lengths, pointers and document indices
   against its ``.bin``; OLMo's ``.csv.gz`` document tables against their ``.npy`` token
   files; the Hugging Face parquet ``input_ids``), and each file's tokens and sequences
   match the listing; tokens must lie below the tokenizer's vocabulary size.
4. The read-back split's format-independent digests (sha256 of its tokens and of its
   sequence lengths, :class:`~tokenmill.manifests.export_plan.StreamDigest`) equal the
   listed ones.
5. With ``mix``: the listed mix identity is that manifest's, and re-planning the mix with
   the listed loader settings gives the same digests (the files hold exactly that mix).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tokenmill.atomic import sha256_file
from tokenmill.manifests.export import EXPORT_FILE, FORMATS
from tokenmill.manifests.export_formats import (
    MEGATRON_DTYPE_CODES,
    MEGATRON_MAGIC,
    MEGATRON_VERSION,
    olmo_dtype,
)
from tokenmill.manifests.export_plan import LoaderSettings, StreamDigest, open_mix, split_streams
from tokenmill.manifests.mixschema import mix_identity_sha256
from tokenmill.manifests.shards import read_sidecar, read_tokens

_CODES = {code: dt for dt, code in MEGATRON_DTYPE_CODES.items()}


class ExportReadError(ValueError):
    """An export file does not read back as its format says (the message names it)."""


def read_listing(out: str | os.PathLike) -> dict:
    """``DIR/export.json``.

    Raises:
        FileNotFoundError: no listing in ``out``.
        ExportReadError: not JSON, or not an export listing of a known format.
    """
    path = Path(out) / EXPORT_FILE
    try:
        listing = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ExportReadError(f"{path}: not JSON ({e})") from None
    if not isinstance(listing, dict) or listing.get("format") not in FORMATS:
        raise ExportReadError(f"{path}: not an export listing (format must be one of "
                              f"{', '.join(FORMATS)})")
    return listing


def _megatron(bin_path: Path) -> tuple[np.ndarray, np.ndarray]:
    idx = bin_path.with_suffix(".idx")
    raw = idx.read_bytes()
    if raw[:9] != MEGATRON_MAGIC or len(raw) < 34:
        raise ExportReadError(f"{idx}: not a Megatron MMIDIDX index")
    version, code = struct.unpack("<Q", raw[9:17])[0], raw[17]
    n, n_doc = struct.unpack("<Q", raw[18:26])[0], struct.unpack("<Q", raw[26:34])[0]
    if version != MEGATRON_VERSION or code not in _CODES:
        raise ExportReadError(f"{idx}: index version {version}, dtype code {code}; "
                              f"expected version {MEGATRON_VERSION} and uint16/int32 tokens")
    if len(raw) != 34 + 4 * n + 8 * n + 8 * n_doc:
        raise ExportReadError(f"{idx}: {len(raw)} bytes, its header says {n} sequences and "
                              f"{n_doc} document indices")
    dtype = _CODES[code]
    lens = np.frombuffer(raw, "<i4", n, 34).astype(np.int64)
    ptrs = np.frombuffer(raw, "<i8", n, 34 + 4 * n)
    doc_idx = np.frombuffer(raw, "<i8", n_doc, 34 + 12 * n)
    want = np.concatenate([[0], np.cumsum(lens)[:-1]]) * dtype.itemsize
    if not np.array_equal(ptrs, want) or not np.array_equal(doc_idx, np.arange(n + 1)):
        raise ExportReadError(f"{idx}: sequence pointers or document indices do not match "
                              "one sequence per document, back to back")
    tokens = np.fromfile(bin_path, dtype.newbyteorder("<"))
    if tokens.size != int(lens.sum()):
        raise ExportReadError(f"{bin_path}: {tokens.size} tokens, its index says "
                              f"{int(lens.sum())}")
    return tokens, lens


def _olmo(npy: Path, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.fromfile(npy, olmo_dtype(n_vocab).newbyteorder("<"))
    table = npy.with_name(npy.name[:-len(".npy")] + ".csv.gz")
    with gzip.open(table, "rb") as f:
        rows = list(csv.reader(io.TextIOWrapper(f, encoding="utf-8")))
    starts = np.array([int(r[0]) for r in rows], np.int64)
    ends = np.array([int(r[1]) for r in rows], np.int64)
    if (len(rows) == 0 or any(len(r) != 5 for r in rows) or starts[0] != 0
            or not np.array_equal(starts[1:], ends[:-1]) or ends[-1] != tokens.size):
        raise ExportReadError(f"{table}: its start,end,id,src,loc rows do not cover "
                              f"{npy.name}'s {tokens.size} tokens back to back")
    return tokens, ends - starts


def _modded_nanogpt(path: Path) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.asarray(read_tokens(path))
    side = read_sidecar(path)
    off = side.column("offset").to_numpy().astype(np.int64)
    lens = side.column("n_tokens").to_numpy().astype(np.int64)
    if len(off) == 0 or not np.array_equal(off, np.concatenate([[0], np.cumsum(lens)[:-1]])) \
            or int(lens.sum()) != tokens.size:
        raise ExportReadError(f"{path}: its sidecar's documents do not cover its "
                              f"{tokens.size} tokens back to back")
    return tokens, lens


def _hf(path: Path) -> tuple[np.ndarray, np.ndarray]:
    col = pq.read_table(path, columns=["input_ids"]).column("input_ids").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    return col.values.to_numpy().astype(np.int64), np.diff(offsets)


def read_file(listing: dict, out: Path, entry: dict) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, sequence lengths) of one listed data file, read through its format.

    Raises:
        ExportReadError: the file does not read back as its format says (names it).
    """
    path, fmt = out / entry["path"], listing["format"]
    if fmt == "megatron":
        return _megatron(path)
    if fmt == "olmo":
        return _olmo(path, int(listing["tokenizer"]["n_vocab"]))
    if fmt == "hf":
        return _hf(path)
    return _modded_nanogpt(path)


#: the files a trainer finds by globbing an export folder, per format
TRAINER_GLOBS = {"modded-nanogpt": ("fineweb_*.bin",), "megatron": ("*.bin", "*.idx"),
                 "olmo": ("*/part-*.npy", "*/part-*.csv.gz"), "hf": ("data/*.parquet",)}


def _file_problems(listing: dict, out: Path) -> list[str]:
    listed = {e["path"] for e in listing["files"]}
    problems = [f"{p}: not listed in {EXPORT_FILE}, but a trainer reading the folder reads it"
                for pattern in TRAINER_GLOBS[listing["format"]]
                for p in sorted(out.glob(pattern))
                if p.relative_to(out).as_posix() not in listed]
    for e in listing["files"]:
        p = out / e["path"]
        if not p.is_file():
            problems.append(f"{p}: listed in {EXPORT_FILE} but missing")
        elif sha256_file(p) != e["sha256"]:
            problems.append(f"{p}: sha256 differs from {EXPORT_FILE} (changed after export)")
    return problems


def split_digests(listing: dict, out: Path) -> Iterator[tuple[str, StreamDigest]]:
    """Each listed split's digests, recomputed from its files read back in order.

    Raises:
        ExportReadError: a file does not read back, or disagrees with its listing.
    """
    n_vocab = int(listing["tokenizer"]["n_vocab"])
    for split in listing.get("streams", {}):
        digest = StreamDigest()
        for e in listing["files"]:
            if e["split"] != split or "role" in e:
                continue
            tokens, lens = read_file(listing, out, e)
            if tokens.size != e["tokens"] or lens.size != e["documents"]:
                raise ExportReadError(f"{out / e['path']}: reads back as {tokens.size} tokens "
                                      f"in {lens.size} sequences, listed {e['tokens']} in "
                                      f"{e['documents']}")
            if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
                raise ExportReadError(f"{out / e['path']}: token id out of the vocabulary's "
                                      f"{n_vocab} ids")
            digest.update(tokens, lens)
        yield split, digest


def _mix_problems(listing: dict, mix: str | os.PathLike, verify: bool) -> list[str]:
    ident = mix_identity_sha256(mix)
    if ident != listing["mix_manifest_sha256"]:
        return [f"{mix}: mix identity {ident[:12]} is not the export's "
                f"{listing['mix_manifest_sha256'][:12]}: the export was made from another mix"]
    ld = listing["loader"]
    settings = LoaderSettings(ld["seq_len"], ld["batch_size"], ld["remainder"],
                              listing.get("packed", False))
    problems = []
    splits = tuple(listing.get("streams", {}))
    for stream in split_streams(open_mix(mix, verify), splits, settings):
        digest = StreamDigest()
        for ch in stream.chunks(1 << 24):
            digest.update(ch.tokens, ch.lengths)
        if digest.as_dict() != listing["streams"][stream.split]:
            problems.append(f"{mix}: its {stream.split} stream for the listed loader settings "
                            "differs from the export's")
    return problems


def verify_export(out: str | os.PathLike, mix: str | os.PathLike | None = None,
                  verify_mix: bool = True) -> tuple[dict, list[str]]:
    """Check an export (module docstring). Returns (its listing, problems, one line each).

    Raises:
        FileNotFoundError, ExportReadError: no readable ``export.json`` in ``out``.
        ShardVerifyError: (``mix``) the mix's own shards fail their check.
    """
    out = Path(out)
    listing = read_listing(out)
    problems = _file_problems(listing, out)
    if problems:
        return listing, problems
    try:
        for split, digest in split_digests(listing, out):
            if digest.as_dict() != listing["streams"][split]:
                problems.append(f"{out}: the {split} files read back differ from the digests "
                                f"in {EXPORT_FILE}")
    except (ExportReadError, ValueError) as e:
        return listing, [str(e)]
    if mix is not None and not problems:
        problems += _mix_problems(listing, mix, verify_mix)
    return listing, problems
