"""The modded-nanogpt export: a training mix as a ready-to-train modded-nanogpt shard set.

``tokenmill shards export --format modded-nanogpt MIX.json -o OUT`` writes
``fineweb_train_000001.bin ...`` (the mixture) and ``fineweb_val_000000.bin ...`` (all
val documents) in modded-nanogpt's layout: a 256-int32 header (magic 20240520,
version 1, token count) and uint16 tokens, which its ``_load_data_shard`` reads
unchanged (it asserts version 1, so only vocabularies up to 65,536 ids, such as GPT-2,
can be exported). Each document starts with the EOT token, which modded-nanogpt's
BOS-aligned loader relies on; a ``*.docs.parquet`` sidecar (offset, n_tokens, key,
source) sits beside each shard (modded-nanogpt ignores it) and ``export.json`` lists
every file with its sha256 and each source's tokens.

The train stream is **exactly the token stream** :class:`tokenmill.train.data.MixLoader`
yields for the same manifest, seed, ``seq_len``, global ``batch_size`` and ``remainder``
(defaults 2048, 1, carry): both follow :mod:`tokenmill.manifests.schedule`. The loader's
rows of ``seq_len + 1`` tokens, step after step, are written back to back; each row is a
run of *pieces* (a whole document, the head of one cut at the row's end, or, opening a
row, a cut document's tail with the EOT token prepended), so every exported document still
starts with EOT and the sidecar names each one's key, source and ``doc_offset`` (its
first token's offset in the original document; > 0 only for a tail). Every prefix of the
stream honours the mixture to within one row. The val stream holds every val document,
whole, in manifest order. Same manifest and options, same bytes.

Before anything is written, every shard and sidecar the manifest lists is checked against
it (:func:`tokenmill.manifests.verify.open_shards`): a stale or truncated shard is refused,
naming the files; ``verify=False`` (``--no-verify``) skips only the sha256 comparison.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokenmill.atomic import atomic_write_text, sha256_file
from tokenmill.manifests.mixschema import TrainingMixManifest, mix_identity_sha256
from tokenmill.manifests.schedule import MixDocuments, MixSchedule, load_documents
from tokenmill.manifests.shards import VERSION_UINT16, version_for_vocab, write_shard
from tokenmill.manifests.verify import open_shards

FORMATS = ("modded-nanogpt",)
DEFAULT_SHARD_TOKENS = 100_000_000  # FineWeb's shards hold 10^8 tokens
DEFAULT_SEQ_LEN = 2048  # modded-nanogpt's max_seq_len for BOS-aligned sequences


@dataclass
class _Pieces:
    """A split's exported documents in stream order: ``length`` tokens from ``offset`` of
    shard ``shard`` (indices into :class:`MixDocuments`), preceded by an EOT when ``bos``;
    ``doc`` is the source document, ``src`` the mix source index. All int64 [n]."""

    shard: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    bos: np.ndarray
    doc: np.ndarray
    src: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """Exported tokens per piece (EOT prepended included)."""
        return self.length + self.bos


def _train_pieces(m: TrainingMixManifest, docs: MixDocuments, seq_len: int, batch_size: int,
                  carry_all: bool) -> _Pieces:
    """The loader's schedule for every step of the budget, flattened in row order."""
    sched = MixSchedule(m, docs, "train", seq_len, batch_size, carry_all=carry_all)
    parts: list[list[np.ndarray]] = [[] for _ in range(6)]
    for step in range(sched.num_steps()):
        n = sched.plan(step)
        src = np.repeat(sched.row_src, np.diff(sched.row_ptr))[:n]
        for lst, a in zip(parts, (sched.piece_shard, sched.piece_off, sched.piece_len,
                                  sched.piece_bos, sched.piece_doc, src), strict=True):
            lst.append(a[:n].copy())
    cols = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
    return _Pieces(*cols)


def _val_pieces(docs: MixDocuments, counts: list[int]) -> _Pieces:
    """Every val document, whole, in manifest order (``counts``: documents per source)."""
    n = len(docs.doc_len)
    return _Pieces(shard=docs.doc_shard, offset=docs.doc_off, length=docs.doc_len,
                   bos=np.zeros(n, np.int64), doc=np.arange(n, dtype=np.int64),
                   src=np.repeat(np.arange(len(counts), dtype=np.int64), counts))


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


def _write_split(out: Path, split: str, first: int, pieces: _Pieces, docs: MixDocuments,
                 names: list[str], eot: int, shard_tokens: int, log) -> list[dict]:
    """Write a split's pieces as ``fineweb_{split}_{first + c:06d}.bin`` files (+ sidecars
    with key, source, doc_offset); returns their ``export.json`` entries."""
    files = []
    keys = docs.keys()
    lens = pieces.tokens
    for c, run in enumerate(_chunks(lens, shard_tokens)):
        n_tok = lens[run]
        offsets = np.concatenate([[0], np.cumsum(n_tok)[:-1]]).astype(np.uint64)
        tokens = np.empty(int(n_tok.sum()), np.uint16)
        doc_keys, srcs, doc_offs = [], [], []
        for j, a, n, bos, d, i, o in zip(
                pieces.shard[run].tolist(), pieces.offset[run].tolist(),
                pieces.length[run].tolist(), pieces.bos[run].tolist(),
                pieces.doc[run].tolist(), pieces.src[run].tolist(), offsets.tolist(),
                strict=True):
            if bos:
                tokens[o] = eot
            tokens[o + bos:o + bos + n] = docs.shards[j][a:a + n]
            doc_keys.append(keys[j][int(docs.doc_row[d])])
            srcs.append(names[i])
            doc_offs.append(a - int(docs.doc_off[d]))
        path = out / f"fineweb_{split}_{first + c:06d}.bin"
        write_shard(path, tokens, VERSION_UINT16, offsets, doc_keys, extra_columns={
            "source": pa.array(srcs, pa.string()),
            "doc_offset": pa.array(doc_offs, pa.uint64())})
        files.append({"path": path.name, "split": split, "tokens": int(tokens.size),
                      "documents": len(doc_keys), "sha256": sha256_file(path)})
        log(f"wrote {path} ({tokens.size:,} tokens, {len(doc_keys)} documents)")
    return files


def _per_source(m: TrainingMixManifest, pieces: _Pieces) -> dict[str, dict]:
    lens = pieces.tokens
    total = int(lens.sum())
    out = {}
    for i, s in enumerate(m.sources):
        t = int(lens[pieces.src == i].sum())
        out[s.name] = {"tokens": t, "documents": int((pieces.src == i).sum()),
                       "share": t / total if total else 0.0,
                       "effective_weight": s.effective_weight}
    return out


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
    """Write ``fineweb_{train,val}_*.bin`` (+ sidecars, ``export.json``) under ``out_dir``.

    Args:
        manifest_path: a training-mix manifest (``tokenmill mix build``).
        shard_tokens: most tokens per output shard (document-aligned; a longer document
            gets a shard of its own).
        seq_len, batch_size, remainder: the :class:`~tokenmill.train.data.MixLoader`
            settings whose token stream the train files hold (``batch_size`` global rows).
        verify: compare every shard's and sidecar's sha256 with the manifest first;
            ``False`` skips only that (presence and headers are always checked).

    Returns:
        The ``export.json`` content (files with split / tokens / documents / sha256,
        per-source train tokens and shares, the loader settings).

    Raises:
        ShardVerifyError: the manifest is missing or is a curation manifest, or a shard
            is missing, truncated or (``verify``) differs from the manifest (names them).
        ValueError: the tokenizer's vocabulary does not fit uint16 (modded-nanogpt reads
            version-1 shards only), or any loader check fails (see
            :func:`tokenmill.manifests.schedule.load_documents`).
    """
    if remainder not in ("carry", "drop"):
        raise ValueError(f"remainder must be 'carry' or 'drop', not {remainder!r}")
    opened = open_shards(manifest_path, None, kind="training-mix", verify=verify)
    m: TrainingMixManifest = opened.manifest
    if version_for_vocab(m.tokenizer.n_vocab) != VERSION_UINT16:
        raise ValueError(
            f"{opened.manifest_path}: tokenizer {m.tokenizer.short()} has "
            f"{m.tokenizer.n_vocab} ids; modded-nanogpt's _load_data_shard reads uint16 "
            "tokens (header version 1) only")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files, per_source = [], {}
    names = [s.name for s in m.sources]  # val documents keep their source's name
    for split in splits:
        docs = load_documents(m, opened.root, split, verify=False)  # verified above
        if split == "train":
            pieces = _train_pieces(m, docs, seq_len, batch_size, remainder == "carry")
            per_source = _per_source(m, pieces)
        else:
            pieces = _val_pieces(docs, [sum(sh.range_documents for sh in s.val_shards)
                                        for s in m.sources])
        # modded-nanogpt: val is shard 000000, train starts at 000001
        files += _write_split(out, split, 1 if split == "train" else 0, pieces, docs, names,
                              int(m.tokenizer.eot_token), shard_tokens, log)
    summary = {"format": "modded-nanogpt", "mix": m.name,
               # the mix's identity: listing side channels in it changes nothing exported
               "mix_manifest_sha256": mix_identity_sha256(opened.manifest_path),
               "loader": {"seq_len": seq_len, "batch_size": batch_size,
                          "remainder": remainder, "verified": verify},
               "tokenizer": m.tokenizer.model_dump(mode="json"), "files": files,
               "sources": per_source}
    atomic_write_text(out / "export.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
