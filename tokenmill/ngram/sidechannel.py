"""Side channels of a training mix: its token stream, and writing the arrays aligned with it.

A side channel holds per-position arrays aligned with the stream
:class:`tokenmill.train.data.MixLoader` yields for a mix (:func:`mix_stream`: its rows of
``seq_len + 1`` tokens, step after step, back to back; row ``r`` of step ``s`` covers
positions ``(s * B + r) * (T + 1) + [0, T + 1)``), in ``.npy`` shards of ``shard_tokens``
positions, and a metadata file (``lem.json``, ``ngram.json``) with the settings, the mix
manifest's path and identity (:func:`~tokenmill.manifests.mixschema.mix_identity_sha256`:
its sha256 without the side-channel listing), the stream's sha256 and every file with its
start, tokens and sha256; all written atomically. Readers: :mod:`tokenmill.train.side`.

* the LEM side channel (:func:`write_lem_side_channel`): ``lem_len_NNNNNN.npy``, match
  lengths, uint8 capped at 255 (uint16 capped at 65,535 with ``len_dtype="uint16"``), and
  ``lem_next_NNNNNN.npy``, ``[n, k]`` candidate next tokens, most recent occurrence first;
* the n-gram side channel (:func:`write_ngram_side_channel`): ``ngram_cand_NNNNNN.npy``,
  ``[n, m]`` candidate next tokens sorted by probability (ties: smaller id first), and
  ``ngram_logp_NNNNNN.npy``, ``[n, m]`` float16 natural-log probabilities (-inf: none).

Candidate tokens are uint16 with 65,535 for "none" when the vocabulary has at most 65,535
ids, else int32 with -1. A re-run into the same folder leaves exactly its own files: shards
of an earlier run that this one did not write are removed once the metadata file is written
(:func:`remove_stale_shards`). The side channel is then listed in the mix manifest
(``side_channels``: its kind, the split, the metadata file and every ``.npy`` file by their
paths relative to the manifest's folder, with sha256), replacing an earlier listing of the
same kind and split (:func:`~tokenmill.manifests.mixschema.register_side_channel`).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenmill.atomic import atomic_write_bytes, atomic_write_text, sha256_bytes, sha256_file
from tokenmill.manifests.mixschema import (
    SideChannelFile,
    SideChannelRef,
    mix_identity_sha256,
    register_side_channel,
)

#: a shard column: (file name prefix, the stream's array, what a shard of it is written as)
Column = tuple[str, np.ndarray, Callable[[np.ndarray], np.ndarray]]


def mix_stream(manifest: str | Path, *, split: str = "train", seq_len: int = 2048,
               batch_size: int = 1, remainder: str = "carry", verify: bool = True
               ) -> tuple[np.ndarray, object, Path]:
    """The MixLoader token stream of a training-mix manifest (module docstring, ``split`` of it).

    Returns:
        ``(tokens int32[steps * B * (T + 1)], manifest model, manifest file)``.

    Raises:
        ShardVerifyError / ValueError: as :func:`tokenmill.manifests.verify.open_shards`
            and :func:`tokenmill.manifests.schedule.load_documents` (naming the file).
    """
    from tokenmill.manifests.schedule import MixSchedule, load_documents
    from tokenmill.manifests.verify import open_shards

    if remainder not in ("carry", "drop"):
        raise ValueError(f"remainder must be 'carry' or 'drop', not {remainder!r}")
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be >= 1")
    opened = open_shards(manifest, split, kind="training-mix", verify=verify)
    m = opened.manifest
    eot = int(m.tokenizer.eot_token)
    docs = load_documents(m, opened.root, split, verify=False)  # verified above
    sched = MixSchedule(m, docs, split, seq_len, batch_size, carry_all=remainder == "carry")
    steps = sched.num_steps()
    if steps == 0:
        raise ValueError(f"{opened.manifest_path}: the {split} split has no whole step of "
                         f"{batch_size} x {seq_len + 1} tokens (make --seq-len or "
                         "--batch-size smaller)")
    out = np.empty(steps * batch_size * (seq_len + 1), np.int32)
    o = 0
    for step in range(steps):
        n = sched.plan(step)
        for i in range(n):
            if sched.piece_bos[i]:
                out[o] = eot
                o += 1
            ln = int(sched.piece_len[i])
            off = int(sched.piece_off[i])
            out[o:o + ln] = docs.shards[int(sched.piece_shard[i])][off:off + ln]
            o += ln
    if o != out.size:
        raise ValueError(f"{opened.manifest_path}: the schedule gave {o:,} tokens for "
                         f"{steps} steps of {batch_size} x {seq_len + 1}")
    return out, m, opened.manifest_path


def check_out_folder(out: str | Path) -> Path:
    """The ``-o`` folder, refused before any work when it names an existing file.

    Raises:
        ValueError: one line naming the path.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: -o must be a folder, this is a file")
    return out


def remove_stale_shards(out: Path, patterns: tuple[str, ...], files: list[dict],
                        keys: tuple[str, ...]) -> list[Path]:
    """Remove the files of ``out`` matching one of the glob ``patterns`` (a side channel's
    shard names, e.g. ``lem_len_*.npy``) that are not among this run's ``files`` (their
    ``keys`` entries): the extra shards an earlier run with more of them left behind.
    Called after the new metadata file is written (the new shards overwrite the old ones
    in place before it, so a crash in between leaves shards the old metadata's sha256
    refuses), so the listing and the folder agree once this returns.

    Returns:
        the files removed, sorted.
    """
    keep = {str(f[k]) for f in files for k in keys}
    stale = sorted({p for pat in patterns for p in out.glob(pat)
                    if p.is_file() and p.name not in keep})
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def npy_bytes(a: np.ndarray) -> bytes:
    """The ``.npy`` file of ``a`` (C order, no pickle), as bytes."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def candidates_as_stored(cand: np.ndarray, n_vocab: int) -> np.ndarray:
    """Candidate tokens (int, -1 = none) as stored: uint16 with 65,535 for none when the
    vocabulary has at most 65,535 ids, else int32 with -1."""
    if n_vocab <= 65535:
        return np.where(cand < 0, 65535, cand).astype(np.uint16)
    return cand.astype(np.int32)


def write_shards(out: Path, columns: dict[str, Column], shard_tokens: int) -> list[dict]:
    """Write every column of ``columns`` in shards of ``shard_tokens`` positions
    (``{prefix}_NNNNNN.npy``, atomically, in column order); returns the shards' entries
    ``{key: file, ..., "start", "tokens", key + "_sha256": hex, ...}``."""
    n = next(iter(columns.values()))[1].shape[0]
    files = []
    for i, a in enumerate(range(0, max(1, n), shard_tokens)):
        names, shas, rows = {}, {}, 0
        for key, (prefix, array, stored) in columns.items():
            part = stored(array[a:a + shard_tokens])
            data = npy_bytes(part)
            names[key] = f"{prefix}_{i:06d}.npy"
            atomic_write_bytes(out / names[key], data)
            shas[f"{key}_sha256"] = sha256_bytes(data)
            rows = int(part.shape[0])
        files.append({**names, "start": a, "tokens": rows, **shas})
    return files


def register_side_channel_files(mix: Path, out: Path, *, kind: str, meta_name: str,
                                keys: tuple[str, ...], split: str, files: list[dict]) -> None:
    """List ``out/meta_name`` and its shards (``files`` as :func:`write_shards` returns
    them, the files under ``keys``) in the mix manifest ``mix``, by paths relative to its
    folder, as a side channel of ``kind`` and ``split``.

    Raises:
        as :func:`tokenmill.manifests.mixschema.register_side_channel`.
    """
    base = Path(mix).resolve().parent

    def rel(name: str) -> str:
        return Path(os.path.relpath((out / name).resolve(), base)).as_posix()

    listed = [SideChannelFile(path=rel(f[key]), sha256=f[f"{key}_sha256"])
              for f in files for key in keys]
    register_side_channel(mix, SideChannelRef(
        kind=kind, split=split, path=rel(meta_name), sha256=sha256_file(out / meta_name),
        files=listed))


def write_side_channel(out: Path, mix: Path, meta: dict, columns: dict[str, Column], *,
                       meta_name: str, shard_tokens: int) -> list[dict]:
    """Write a side channel into ``out`` (created): the shards of ``columns``, the metadata
    file ``meta_name`` (``meta`` with ``files`` last), the stale shards of an earlier run
    removed, the whole listed in the mix manifest ``mix`` under ``meta["kind"]`` and
    ``meta["split"]``. Returns the shards' entries."""
    out.mkdir(parents=True, exist_ok=True)
    files = write_shards(out, columns, shard_tokens)
    atomic_write_text(out / meta_name, json.dumps({**meta, "files": files}, indent=1) + "\n")
    keys = tuple(columns)
    remove_stale_shards(out, tuple(f"{p}_*.npy" for p, _, _ in columns.values()), files, keys)
    register_side_channel_files(mix, out, kind=meta["kind"], meta_name=meta_name, keys=keys,
                                split=meta["split"], files=files)
    return files


def stream_record(mix: Path, tokens: np.ndarray) -> dict:
    """The metadata fields binding a side channel to its stream: the mix manifest's path and
    identity, the stream's length and sha256 (of its int32 little-endian bytes)."""
    return {"mix": str(mix), "mix_sha256": mix_identity_sha256(mix),
            "tokens": int(tokens.size), "stream_sha256": sha256_bytes(
                tokens.astype("<i4").tobytes())}


def write_lem_side_channel(out: Path, mix: Path, tokens: np.ndarray, match_len: np.ndarray,
                           next_tokens: np.ndarray, *, settings: dict, n_vocab: int,
                           shard_tokens: int, len_dtype: str = "uint8") -> list[dict]:
    """Write the LEM side channel of ``tokens`` (module docstring): ``lem.json`` holds
    ``kind``, the mix, then ``settings`` (``split``, ``seq_len``, ``batch_size``,
    ``remainder``, ``mode``, ``k``, ``window``, ``max_len``, ``eot``, in that order), the
    stream's length and sha256, and the files. Returns the shards' entries."""
    rec = stream_record(mix, tokens)
    meta = {"kind": "lem-side-channel", "mix": rec["mix"], "mix_sha256": rec["mix_sha256"],
            **settings, "tokens": rec["tokens"], "stream_sha256": rec["stream_sha256"]}
    cap = np.iinfo(len_dtype).max
    columns: dict[str, Column] = {
        "len": ("lem_len", match_len, lambda a: np.minimum(a, cap).astype(len_dtype)),
        "next": ("lem_next", next_tokens, lambda a: candidates_as_stored(a, n_vocab))}
    return write_side_channel(out, mix, meta, columns, meta_name="lem.json",
                              shard_tokens=shard_tokens)


def write_ngram_side_channel(out: Path, mix: Path, tokens: np.ndarray, cand: np.ndarray,
                             logp: np.ndarray, *, settings: dict, n_vocab: int,
                             shard_tokens: int) -> list[dict]:
    """Write the n-gram side channel of ``tokens`` (module docstring): ``ngram.json`` holds
    ``kind``, the mix, then ``settings`` (``split``, ``seq_len``, ``batch_size``,
    ``remainder``, ``orders``, ``beta``, ``m``, ``chunk_tokens``, ``eot``, in that order),
    the stream's length and sha256, and the files. Returns the shards' entries."""
    rec = stream_record(mix, tokens)
    meta = {"kind": "ngram-side-channel", "mix": rec["mix"], "mix_sha256": rec["mix_sha256"],
            **settings, "tokens": rec["tokens"], "stream_sha256": rec["stream_sha256"]}
    columns: dict[str, Column] = {
        "cand": ("ngram_cand", cand, lambda a: candidates_as_stored(a, n_vocab)),
        "logp": ("ngram_logp", logp, lambda a: a.astype(np.float16))}
    return write_side_channel(out, mix, meta, columns, meta_name="ngram.json",
                              shard_tokens=shard_tokens)
