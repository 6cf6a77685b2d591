"""Export a training datamix as a ready-to-train modded-nanogpt shard set.

``tokenmill shards export --format modded-nanogpt MIX.json -o OUT`` writes
``fineweb_train_000001.bin ...`` (the mixture) and ``fineweb_val_000000.bin ...`` (all
val documents) in modded-nanogpt's layout: a 256-int32 header (magic 20240520,
version 1, token count) and uint16 tokens, which its ``_load_data_shard`` reads
unchanged (it asserts version 1, so only vocabularies up to 65,536 ids, such as GPT-2,
can be exported). Each document starts with the EOT token, which modded-nanogpt's
BOS-aligned loader relies on; a ``*.docs.parquet`` sidecar (offset, n_tokens, key,
source) sits beside each shard (modded-nanogpt ignores it) and ``export.json`` lists
every file with its sha256 and each source's tokens.

The train stream interleaves **whole documents**: each source's documents are read in
the same seeded per-epoch order as :mod:`tokenmill.train.data` uses, and the next
document always comes from the source furthest behind its planned cumulative tokens
(the manifest's effective weight schedule integrated over the stream), until each
source has contributed exactly its granted tokens (its last document is cut to fit; the
cut head still starts with EOT).
So every prefix of the stream, and thus whatever modded-nanogpt reads of it, honours
the mixture. Same manifest, same bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
from numba import njit

from tokenmill.atomic import atomic_write_text, sha256_file
from tokenmill.manifests.mix import TrainingMixManifest, load_mix_manifest
from tokenmill.manifests.shards import (
    VERSION_UINT16,
    read_sidecar,
    version_for_vocab,
    write_shard,
)
from tokenmill.train.data import _key, _shuffle_range, load_documents

FORMATS = ("modded-nanogpt",)
DEFAULT_SHARD_TOKENS = 100_000_000  # FineWeb's shards hold 10^8 tokens


@njit(cache=True)
def _mixed_order(seed, seg_start, seg_w, grant, src_lo, src_hi, doc_len):
    """Whole-document interleaving (see the module docstring).

    Returns (doc indices, their source, tokens taken: the whole document except for a
    source's last one, cut to its grant). Deficit rule: pick the source with the largest
    planned(total) - emitted among those with emitted < grant; planned_i(t) is the
    integral of source i's effective weight over stream tokens [0, t).
    """
    n_src = grant.shape[0]
    perm = np.arange(doc_len.shape[0])
    epoch = np.zeros(n_src, np.int64)
    pos = np.zeros(n_src, np.int64)
    count = np.zeros(n_src, np.int64)
    for i in range(n_src):  # how many documents each source needs
        n_docs = src_hi[i] - src_lo[i]
        got = 0
        e = 0
        while got < grant[i] and n_docs > 0:
            _shuffle_range(perm, src_lo[i], src_hi[i], _key(seed, np.uint64(i + 1),
                                                            np.uint64(e)))
            for k in range(src_lo[i], src_hi[i]):
                if got >= grant[i]:
                    break
                got += doc_len[perm[k]]
                count[i] += 1
            e += 1
        _shuffle_range(perm, src_lo[i], src_hi[i], _key(seed, np.uint64(i + 1), np.uint64(0)))
    n = count.sum()
    out_doc = np.empty(n, np.int64)
    out_src = np.empty(n, np.int64)
    out_len = np.empty(n, np.int64)
    emitted = np.zeros(n_src, np.int64)
    total = 0
    n_seg = seg_start.shape[0]
    for j in range(n):
        best = -1
        best_def = 0.0
        for i in range(n_src):
            if emitted[i] >= grant[i]:
                continue
            planned = 0.0
            for k in range(n_seg):
                a = seg_start[k]
                b = seg_start[k + 1] if k + 1 < n_seg else 1 << 62
                if total > a:
                    planned += seg_w[k, i] * (min(total, b) - a)
            d = planned - emitted[i]
            if best < 0 or d > best_def:
                best = i
                best_def = d
        i = best
        n_docs = src_hi[i] - src_lo[i]
        if pos[i] == n_docs:
            epoch[i] += 1
            pos[i] = 0
            _shuffle_range(perm, src_lo[i], src_hi[i],
                           _key(seed, np.uint64(i + 1), np.uint64(epoch[i])))
        d = perm[src_lo[i] + pos[i]]
        pos[i] += 1
        take = min(doc_len[d], grant[i] - emitted[i])
        out_doc[j] = d
        out_src[j] = i
        out_len[j] = take
        emitted[i] += take
        total += take
    return out_doc, out_src, out_len


def _chunks(lens: np.ndarray, shard_tokens: int) -> list[slice]:
    """Document-aligned runs of the stream of at most ``shard_tokens`` tokens."""
    out, start, size = [], 0, 0
    for j, n in enumerate(lens.tolist()):
        if size and size + n > shard_tokens:
            out.append(slice(start, j))
            start, size = j, 0
        size += n
    if start < len(lens):
        out.append(slice(start, len(lens)))
    return out


def export_modded_nanogpt(
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    splits: tuple[str, ...] = ("train", "val"),
    log=print,
) -> dict:
    """Write ``fineweb_{train,val}_*.bin`` (+ sidecars, ``export.json``) under ``out_dir``.

    Args:
        manifest_path: a training datamix manifest (``tokenmill mix build``).
        shard_tokens: most tokens per output shard (document-aligned; a longer document
            gets a shard of its own).

    Returns:
        The ``export.json`` content (files with split / tokens / documents / sha256,
        per-source train tokens and shares).

    Raises:
        ValueError: the tokenizer's vocabulary does not fit uint16 (modded-nanogpt reads
            version-1 shards only), or any loader check fails (see
            :func:`tokenmill.train.data.load_documents`).
    """
    manifest_path = Path(manifest_path)
    m: TrainingMixManifest = load_mix_manifest(manifest_path)
    if version_for_vocab(m.tokenizer.n_vocab) != VERSION_UINT16:
        raise ValueError(
            f"{manifest_path}: tokenizer {m.tokenizer.short()} has {m.tokenizer.n_vocab} ids; "
            "modded-nanogpt's _load_data_shard reads uint16 tokens (header version 1) only")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    root = manifest_path.resolve().parent
    seed = np.uint64(m.seed & 0xFFFFFFFFFFFFFFFF)
    files, per_source = [], {}
    for split in splits:
        docs = load_documents(m, root, split)
        if split == "train":
            names = docs.source_names
            seg_start = np.array([s.start_token for s in m.segments], np.int64)
            seg_w = np.array([[s.weights.get(n, 0.0) for n in names] for s in m.segments])
            grant = np.array([s.granted_tokens for s in m.sources], np.int64)
            order, src, take = _mixed_order(seed, seg_start, seg_w, grant, docs.src_lo,
                                      docs.src_hi, docs.doc_len)
            first = 1  # modded-nanogpt: val is shard 000000, train starts at 000001
        else:
            order = np.arange(len(docs.doc_len), dtype=np.int64)
            counts = [sum(sh.range_documents for sh in s.val_shards) for s in m.sources]
            src = np.repeat(np.arange(len(m.sources), dtype=np.int64), counts)
            take = docs.doc_len.copy()
            names = [s.name for s in m.sources]  # val documents keep their source's name
            first = 0
        keys_cache: dict[int, list[str]] = {}
        for c, run in enumerate(_chunks(take, shard_tokens)):
            lens = take[run]
            offsets = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.uint64)
            tokens = np.empty(int(lens.sum()), np.uint16)
            keys, srcs = [], []
            for d, i, o, n in zip(order[run].tolist(), src[run].tolist(), offsets.tolist(),
                                  lens.tolist(), strict=True):
                j = int(docs.doc_shard[d])
                a = int(docs.doc_off[d])
                tokens[o:o + n] = docs.shards[j][a:a + n]
                if j not in keys_cache:
                    keys_cache[j] = read_sidecar(docs.shard_paths[j]).column("key").to_pylist()
                keys.append(keys_cache[j][int(docs.doc_row[d])])
                srcs.append(names[i])
            path = out / f"fineweb_{split}_{first + c:06d}.bin"
            write_shard(path, tokens, VERSION_UINT16, offsets, keys,
                        extra_columns={"source": pa.array(srcs, pa.string())})
            files.append({"path": path.name, "split": split, "tokens": int(tokens.size),
                          "documents": len(keys), "sha256": sha256_file(path)})
            log(f"wrote {path} ({tokens.size:,} tokens, {len(keys)} documents)")
        if split == "train":
            total = int(take.sum())
            for i, n in enumerate(names):
                t = int(take[src == i].sum())
                per_source[n] = {"tokens": t, "documents": int((src == i).sum()),
                                 "share": t / total if total else 0.0,
                                 "effective_weight": m.sources[i].effective_weight}
    summary = {"format": "modded-nanogpt", "mix": m.name,
               "mix_manifest_sha256": sha256_file(manifest_path),
               "tokenizer": m.tokenizer.model_dump(mode="json"), "files": files,
               "sources": per_source}
    atomic_write_text(out / "export.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
