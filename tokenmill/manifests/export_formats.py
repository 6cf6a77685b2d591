"""The export layouts other trainers read: Megatron-LM / NeMo, OLMo (Dolma) and Hugging Face.

Each writer takes a split's chunks (:class:`tokenmill.manifests.export_plan.Chunk`, one
sequence per loader piece or packed row, in stream order) and returns the ``export.json``
entries of the files it wrote. All files are written atomically; the same chunks give the
same bytes.

* **megatron** (``MegatronWriter``): per split a path prefix ``DIR/train`` / ``DIR/val``
  with ``.bin`` (the tokens back to back) and ``.idx`` in Megatron's ``MMIDIDX`` index
  layout, version 1, as ``megatron.core.datasets.indexed_dataset`` writes it: the 9-byte
  magic ``MMIDIDX\\0\\0``, uint64 version 1, uint8 dtype code (8 = uint16 for a vocabulary
  below 65,500 ids, 4 = int32 above, Megatron's ``DType.optimal_dtype`` rule), uint64
  sequence count, uint64 document-index count, then int32 sequence lengths, int64 byte
  pointers and int64 document indices ``0..n`` (one sequence per document). All little
  endian.
* **olmo** (``OlmoWriter``): the Dolma tokenizer layout that OLMo's numpy datasets read:
  ``DIR/{split}/part-{c:05d}.npy``, raw little-endian token memmaps (no ``.npy`` header,
  as Dolma writes them; uint16 up to 65,536 ids, else uint32), each with the document
  table ``part-{c:05d}.csv.gz`` of one ``start,end,id,src,loc`` row per sequence (token
  offsets, end exclusive; the document key; the mix source; ``doc_offset``, the offset
  of the sequence's first shard token in the original document).
* **hf** (``HfWriter``): ``DIR/data/{train,validation}-{c:05d}.parquet`` with columns
  ``input_ids`` (list<int32>), ``key``, ``source``, ``doc_offset``, and a dataset card
  ``DIR/README.md`` whose YAML ``configs`` name the files, so that
  ``datasets.load_dataset(DIR)`` loads it offline.
"""

from __future__ import annotations

import csv
import gzip
import io
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.atomic import atomic_open, atomic_write_text, sha256_file
from tokenmill.manifests.export_plan import Chunk, LoaderSettings
from tokenmill.manifests.mixschema import TrainingMixManifest

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
MEGATRON_UINT16_BELOW = 65_500  # Megatron's DType.optimal_dtype cut-off
HF_SPLITS = {"train": "train", "val": "validation"}


def megatron_dtype(n_vocab: int) -> np.dtype:
    """uint16 below 65,500 ids, else int32 (Megatron's ``DType.optimal_dtype``)."""
    return np.dtype(np.uint16 if n_vocab < MEGATRON_UINT16_BELOW else np.int32)


def olmo_dtype(n_vocab: int) -> np.dtype:
    """uint16 up to 65,536 ids, else uint32 (Dolma's choice)."""
    return np.dtype(np.uint16 if n_vocab <= 1 << 16 else np.uint32)


def _entry(path: Path, root: Path, split: str, tokens: int | None = None,
           documents: int | None = None, role: str | None = None) -> dict:
    e = {"path": path.relative_to(root).as_posix(), "split": split,
         "sha256": sha256_file(path)}
    if role:
        e["role"] = role
    if tokens is not None:
        e.update(tokens=int(tokens), documents=int(documents or 0))
    return e


def megatron_index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` file of sequences ``lengths`` (int64 [n]) of ``dtype`` tokens."""
    n = int(lengths.size)
    if n and int(lengths.max()) >= 1 << 31:
        raise ValueError(f"a sequence of {int(lengths.max())} tokens does not fit Megatron's "
                         "int32 sequence lengths")
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8") * dtype.itemsize
    head = (MEGATRON_MAGIC + struct.pack("<Q", MEGATRON_VERSION)
            + struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]) + struct.pack("<Q", n)
            + struct.pack("<Q", n + 1))
    return (head + lengths.astype("<i4").tobytes() + pointers.tobytes()
            + np.arange(n + 1, dtype="<i8").tobytes())


class MegatronWriter:
    """``DIR/{split}.bin`` + ``DIR/{split}.idx`` per split (module docstring)."""

    def __init__(self, out: Path, m: TrainingMixManifest, settings: LoaderSettings) -> None:
        self.out, self.dtype = out, megatron_dtype(m.tokenizer.n_vocab)

    def write_split(self, split: str, chunks: Iterable[Chunk], log) -> list[dict]:
        bin_path, idx_path = self.out / f"{split}.bin", self.out / f"{split}.idx"
        lengths = []
        with atomic_open(bin_path) as f:
            for ch in chunks:
                f.write(ch.tokens.astype(self.dtype.newbyteorder("<")).tobytes())
                lengths.append(ch.lengths)
        lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        with atomic_open(idx_path) as f:
            f.write(megatron_index_bytes(lens, self.dtype))
        log(f"wrote {bin_path} and .idx ({int(lens.sum()):,} tokens, {lens.size} documents)")
        return [_entry(bin_path, self.out, split, int(lens.sum()), lens.size),
                _entry(idx_path, self.out, split, role="index")]

    def finish(self, summary: dict) -> list[dict]:
        return []


def olmo_table_bytes(ch: Chunk) -> bytes:
    """The gzipped ``start,end,id,src,loc`` table of a chunk (gzip mtime 0: same bytes)."""
    text = io.StringIO()
    w = csv.writer(text, lineterminator="\n")
    starts = ch.offsets
    for s, n, key, src, at in zip(starts.tolist(), ch.lengths.tolist(), ch.keys, ch.sources,
                                  ch.doc_offsets, strict=True):
        w.writerow([s, s + n, key, src, at])
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        gz.write(text.getvalue().encode("utf-8"))
    return buf.getvalue()


class OlmoWriter:
    """``DIR/{split}/part-{c:05d}.npy`` + ``.csv.gz`` per chunk (module docstring). Train
    files hold whole loader rows, so that OLMo's fixed-length instances of ``seq_len + 1``
    tokens (each file is cut on its own) are the loader's rows."""

    align_rows = True

    def __init__(self, out: Path, m: TrainingMixManifest, settings: LoaderSettings) -> None:
        self.out, self.dtype = out, olmo_dtype(m.tokenizer.n_vocab)

    def write_split(self, split: str, chunks: Iterable[Chunk], log) -> list[dict]:
        files = []
        for c, ch in enumerate(chunks):
            npy = self.out / split / f"part-{c:05d}.npy"
            table = npy.with_name(f"part-{c:05d}.csv.gz")
            with atomic_open(npy) as f:
                f.write(ch.tokens.astype(self.dtype.newbyteorder("<")).tobytes())
            with atomic_open(table) as f:
                f.write(olmo_table_bytes(ch))
            files += [_entry(npy, self.out, split, ch.tokens.size, len(ch.keys)),
                      _entry(table, self.out, split, role="document-table")]
            log(f"wrote {npy} ({ch.tokens.size:,} tokens, {len(ch.keys)} documents)")
        return files

    def finish(self, summary: dict) -> list[dict]:
        return []


def hf_table(ch: Chunk) -> pa.Table:
    """A chunk as the parquet table: one row per sequence."""
    ids = pa.ListArray.from_arrays(pa.array(np.append(ch.offsets, ch.tokens.size), pa.int32()),
                                   pa.array(ch.tokens, pa.int32()))
    return pa.table({"input_ids": ids, "key": pa.array(ch.keys, pa.string()),
                     "source": pa.array(ch.sources, pa.string()),
                     "doc_offset": pa.array(ch.doc_offsets, pa.int64())})


class HfWriter:
    """``DIR/data/{split}-{c:05d}.parquet`` per chunk and the card ``DIR/README.md``."""

    def __init__(self, out: Path, m: TrainingMixManifest, settings: LoaderSettings) -> None:
        self.out, self.m, self.settings = out, m, settings

    def write_split(self, split: str, chunks: Iterable[Chunk], log) -> list[dict]:
        files = []
        for c, ch in enumerate(chunks):
            path = self.out / "data" / f"{HF_SPLITS[split]}-{c:05d}.parquet"
            with atomic_open(path) as f:
                pq.write_table(hf_table(ch), f, compression="zstd")
            files.append(_entry(path, self.out, split, ch.tokens.size, len(ch.keys)))
            log(f"wrote {path} ({ch.tokens.size:,} tokens, {len(ch.keys)} rows)")
        return files

    def finish(self, summary: dict) -> list[dict]:
        card = self.out / "README.md"
        atomic_write_text(card, dataset_card(summary))
        return [_entry(card, self.out, "all", role="dataset-card")]


def dataset_card(summary: dict) -> str:
    """The dataset card: YAML ``configs`` naming each split's parquet files, then what the
    rows hold."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:"]
    for split in summary["splits"]:
        lines += [f"  - split: {HF_SPLITS[split]}",
                  f"    path: data/{HF_SPLITS[split]}-*.parquet"]
    tok, ld = summary["tokenizer"], summary["loader"]
    unit = (f"one loader row of {ld['seq_len'] + 1} tokens" if summary["packed"]
            else "one document (a piece of the loader's stream)")
    lines += ["tags:", "- tokenmill", "- pretokenized", "---", "",
              f"# {summary['mix']}", "",
              f"Token ids of the training mix `{summary['mix']}` (identity "
              f"`{summary['mix_manifest_sha256']}`), tokenized with `{tok['name']}` (ranks "
              f"sha256 `{tok['ranks_sha256']}`, {tok['n_vocab']} ids, EOT {tok['eot_token']}).",
              "", f"Each row of `input_ids` is {unit}; every document starts with EOT. The "
              "train split holds exactly the token stream of tokenmill's MixLoader for "
              f"seq_len={ld['seq_len']}, batch_size={ld['batch_size']}, "
              f"remainder={ld['remainder']}; `key`, `source` and `doc_offset` name the "
              "document, its mix source and the offset of the row's first token in it.",
              "", "Licenses are those of the sources in the curation manifests the mix was "
              "built from. `export.json` lists every file with its sha256; "
              "`tokenmill export verify DIR` checks them.", ""]
    return "\n".join(lines)
