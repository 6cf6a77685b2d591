"""The curated text as a parquet dataset in the Hugging Face Hub layout (``--write-text``).

A post-step of ``tokenmill run``: it reads the finished output only through the verified
path (:func:`tokenmill.manifests.verify.open_shards`: manifest, shard headers and the
sha256 of every shard and sidecar) and decodes every document from its shard with the
manifest's tokenizer at the offsets of the shard's sidecar. tiktoken's BPE round-trips
exactly (``decode(encode_ordinary(t)) == t``), so each row's ``text`` is the curated text
that was tokenized. Nothing here depends on how the executor made the shards.

Layout (``OUT/text/``, loadable with ``datasets.load_dataset("OUT/text")``)::

    README.md                                       dataset card: YAML configs + licenses
    <source>/data/train-NNNNN-of-NNNNN.parquet      one file per train shard of <source>
    <source>/data/validation-NNNNN-of-NNNNN.parquet one file per val shard

The card's YAML header declares one ``default`` config over every source (the one
``load_dataset(folder)`` loads) and one config per source (``load_dataset(folder,
name=SOURCE)``), following the Hub's "manually configured" repository structure
(https://huggingface.co/docs/datasets/repository_structure). The manifest's ``val``
split is the Hub's ``validation``. A source or split without documents has no file
(``datasets`` cannot read a parquet file without rows) and no entry in the card.

Columns: ``text`` (string), ``key`` (the document key ``source/file#row``), ``source``,
``license`` (per document where the source has per-document licenses, else the
source's), ``language`` and ``language_score`` (the language-id label, null where the
sidecar has none) and ``n_tokens`` (int32, tokens of ``text``; the shard's leading EOT is
not counted). Rows are in shard order.

The folder is built beside the output in a temporary folder and renamed into place, so
a crash leaves the previous ``text/`` or none, never a partial one; every file is
written with :func:`tokenmill.atomic.atomic_open`. The bytes depend only on the
manifest, its shards and this module's ``FORMAT``: two runs give identical files. A
rerun whose card is unchanged (same manifest sha256) and whose files exist is reused.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tiktoken
import yaml

from tokenmill.atomic import atomic_open, atomic_write_text, sha256_file
from tokenmill.manifests.schema import DatamixManifest, SourceEntry
from tokenmill.manifests.shards import read_sidecar, read_tokens
from tokenmill.manifests.verify import OpenedShards, VerifiedShard, check_shards, open_shards
from tokenmill.tokenizers import load_checked

#: Version of this layout; it is written into the card, so a change rewrites old folders.
FORMAT = 1
TEXT_DIR = "text"
CARD_NAME = "README.md"
#: manifest split -> Hub split name
HUB_SPLITS = {"train": "train", "val": "validation"}
SCHEMA = pa.schema([
    ("text", pa.string()), ("key", pa.string()), ("source", pa.string()),
    ("license", pa.string()), ("language", pa.string()), ("language_score", pa.float32()),
    ("n_tokens", pa.int32()),
])
#: a parquet row group holds at most this many documents or (about) this many text bytes
ROW_GROUP_DOCS = 10_000
ROW_GROUP_BYTES = 64 << 20
_DICT_COLUMNS = ["source", "license", "language"]


class HubTextError(ValueError):
    """A document cannot be written as text; the one-line message names the shard and
    the document key (or the output folder)."""


@dataclass(frozen=True)
class TextFile:
    """One parquet file of the text dataset and the shard it is decoded from."""

    shard: VerifiedShard
    split: str               # the Hub split name (``train``, ``validation``)
    rel: str                 # path relative to the text folder
    license: str             # the source's license (rows without a per-document one)


@dataclass(frozen=True)
class HubText:
    """What :func:`write_hub_text` wrote (or found already written)."""

    folder: Path             # the dataset folder (``OUT/text``)
    files: list[str]         # parquet files, relative to ``folder``, in source/split order
    documents: int           # rows in all files
    reused: bool             # True: the folder was already up to date, nothing written
    licenses: dict[str, int] = field(default_factory=dict)  # license -> documents


def plan_files(opened: OpenedShards) -> list[TextFile]:
    """One :class:`TextFile` per shard with documents: ``<source>/data/<split>-i-of-n``,
    ``i`` counting the source's shards of that split in manifest order."""
    m = opened.manifest
    by_source = {s.name: s for s in m.sources}
    groups: dict[tuple[str, str], list[VerifiedShard]] = {}
    for s in opened.shards:
        if s.entry.documents > 0:
            groups.setdefault((s.source, s.entry.split), []).append(s)
    out = []
    for src in m.sources:
        for split, hub in HUB_SPLITS.items():
            shards = groups.get((src.name, split), [])
            out += [TextFile(shard=s, split=hub, license=by_source[src.name].license,
                             rel=f"{src.name}/data/{hub}-{i:05d}-of-{len(shards):05d}.parquet")
                    for i, s in enumerate(shards)]
    return out


def _license_counts(files: list[TextFile]) -> dict[str, Counter]:
    """source -> per-document license -> documents, from the sidecars' ``license``
    column where there is one (only that column is read), else the source license for
    every document."""
    out: dict[str, Counter] = {}
    for f in files:
        c = out.setdefault(f.shard.source, Counter())
        try:
            with pq.ParquetFile(f.shard.sidecar) as side:
                if "license" in side.schema_arrow.names:
                    lic = side.read(columns=["license"]).column(0).to_pylist()
                    c.update(x if x is not None else f.license for x in lic)
                else:
                    c[f.license] += side.metadata.num_rows
        except (OSError, pa.ArrowException) as e:
            raise HubTextError(f"{f.shard.sidecar}: unreadable document sidecar ({e})") from None
    return out


def _configs(m: DatamixManifest, files: list[TextFile]) -> list[dict]:
    """The card's ``configs``: ``default`` over every source, then one per source."""
    splits_of: dict[str, list[str]] = {}
    for f in files:
        if f.split not in splits_of.setdefault(f.shard.source, []):
            splits_of[f.shard.source].append(f.split)
    every = [h for h in HUB_SPLITS.values() if any(h in v for v in splits_of.values())]
    names = {s.name for s in m.sources}
    default_name = "default" if "default" not in names else "all"
    configs = [{"config_name": default_name, "default": True, "data_files": [
        {"split": h, "path": f"*/data/{h}-*.parquet"} for h in every]}]
    for src in m.sources:
        if src.name in splits_of:
            configs.append({"config_name": src.name, "data_files": [
                {"split": h, "path": f"{src.name}/data/{h}-*.parquet"}
                for h in splits_of[src.name]]})
    return configs


def _source_rows(m: DatamixManifest, licenses: dict[str, Counter]) -> list[str]:
    """The card's per-source table, one markdown line per source."""
    def cell(src: SourceEntry) -> str:
        lic = licenses.get(src.name)
        per_doc = ", ".join(f"{k} {v}" for k, v in sorted(lic.items())) if lic else ""
        return per_doc if lic and set(lic) != {src.license} else src.license

    rows = ["| source | origin | license (documents) | documents in | kept: train | "
            "kept: validation | tokens: train | tokens: validation | mixture weight |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for src in m.sources:
        origin = src.origin + (f"@{src.revision}" if src.revision else "")
        rows.append(f"| {src.name} | {origin} | {cell(src)} | {src.counts.read} | "
                    f"{src.documents.get('train', 0)} | {src.documents.get('val', 0)} | "
                    f"{src.tokens.get('train', 0)} | {src.tokens.get('val', 0)} | "
                    f"{src.mixture_weight:g} |")
    return rows


def dataset_card(m: DatamixManifest, manifest_sha256: str, files: list[TextFile],
                 licenses: dict[str, Counter]) -> str:
    """The ``README.md`` dataset card: YAML header (pretty_name, license list, configs)
    and a body listing the sources with their licenses and counts, the tokenizer, the
    config sha256 and the manifest sha256. Deterministic: no dates, no absolute paths."""
    all_licenses = sorted({k for c in licenses.values() for k in c})
    header = {"pretty_name": f"{m.name} (curated text, tokenmill)",
              "license": all_licenses, "tags": ["tokenmill", "pretraining"],
              "configs": _configs(m, files)}
    tok = m.tokenizer
    body = [
        f"# {m.name}: curated text",
        "",
        f"The documents that `tokenmill run` kept for the datamix `{m.name}`, as text: "
        "every row is one document, decoded from the token shards of the curation "
        "manifest with its tokenizer (exact round trip, so `text` is the curated, "
        "normalized text that was tokenized).",
        "",
        f"- tokenizer: `{tok.name}` (ranks sha256 `{tok.ranks_sha256}`, "
        f"{tok.n_vocab} ids, EOT {tok.eot_token})",
        f"- datamix config sha256: `{m.config_sha256}`",
        f"- curation manifest sha256: `{manifest_sha256}`",
        f"- tokenmill text format: {FORMAT}",
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("path/to/text")                 # every source (config '
        f'"{header["configs"][0]["config_name"]}")',
        'one = load_dataset("path/to/text", name="SOURCE")  # one source',
        "```",
        "",
        "## Sources",
        "",
        *_source_rows(m, licenses),
        "",
        "Tokens count the EOT that starts every document in the shards. `validation` is "
        "the manifest's `val` split. `<source>/data/<split>-i-of-n.parquet` holds the "
        "documents of the source's i-th shard of that split, in shard order.",
        "",
        "## Columns",
        "",
        "- `text`: the document; `key`: its key `source/file#row` (as in the shard "
        "sidecars and the quarantine); `source`: the source name",
        "- `license`: the document's license (per document where the source has them, "
        "else the source's); `language`, `language_score`: the language-id label",
        "- `n_tokens`: tokens of `text` with the tokenizer above",
        "",
    ]
    head = yaml.safe_dump(header, sort_keys=False, allow_unicode=True, width=1000)
    return "---\n" + head + "---\n\n" + "\n".join(body)


def _rows(enc: tiktoken.Encoding, f: TextFile) -> Iterator[pa.Table]:
    """The documents of one shard as tables of at most :data:`ROW_GROUP_DOCS` rows or
    about :data:`ROW_GROUP_BYTES` text bytes (one parquet row group each)."""
    tokens = read_tokens(f.shard.path)
    side = read_sidecar(f.shard.path)
    cols = side.column_names
    if side.num_rows != f.shard.entry.documents:
        raise HubTextError(f"{f.shard.sidecar}: {side.num_rows} documents, the manifest "
                           f"says {f.shard.entry.documents}")
    offsets = side.column("offset").to_numpy()
    lengths = side.column("n_tokens").to_numpy()
    keys = side.column("key").to_pylist()
    lic = ([x if x is not None else f.license for x in side.column("license").to_pylist()]
           if "license" in cols else None)
    lang = side.column("language").to_pylist() if "language" in cols else None
    score = side.column("language_score").to_pylist() if "language_score" in cols else None
    start, size, texts = 0, 0, []
    for i, (off, n) in enumerate(zip(offsets, lengths, strict=True)):
        toks = np.asarray(tokens[int(off):int(off) + int(n)])
        if n == 0 or int(toks[0]) != enc.eot_token:
            raise HubTextError(f"{f.shard.path}: document {keys[i]} does not start with the "
                               f"EOT token {enc.eot_token}")
        try:
            texts.append(enc.decode_bytes(toks[1:].tolist()).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise HubTextError(f"{f.shard.path}: document {keys[i]} does not decode to "
                               f"UTF-8 ({e})") from None
        size += len(texts[-1])
        if len(texts) == ROW_GROUP_DOCS or size >= ROW_GROUP_BYTES or i + 1 == len(keys):
            end = i + 1
            yield pa.table({
                "text": texts, "key": keys[start:end], "source": [f.shard.source] * len(texts),
                "license": lic[start:end] if lic else [f.license] * len(texts),
                "language": lang[start:end] if lang else [None] * len(texts),
                "language_score": score[start:end] if score else [None] * len(texts),
                "n_tokens": (lengths[start:end].astype(np.int64) - 1).astype(np.int32),
            }, schema=SCHEMA)
            start, size, texts = end, 0, []


def write_text_file(enc: tiktoken.Encoding, f: TextFile, folder: Path) -> int:
    """Decode one shard into ``folder/f.rel`` (zstd parquet, written atomically).

    Returns:
        Documents written.

    Raises:
        HubTextError: a document does not start with EOT or is not valid UTF-8.
    """
    n = 0
    with atomic_open(folder / f.rel) as out, pq.ParquetWriter(
            out, SCHEMA, compression="zstd", use_dictionary=_DICT_COLUMNS) as w:
        for table in _rows(enc, f):
            w.write_table(table)
            n += table.num_rows
    return n


def _up_to_date(folder: Path, card: str, files: list[TextFile]) -> bool:
    """The folder holds this exact card and every planned file."""
    p = folder / CARD_NAME
    return (p.is_file() and p.read_text(encoding="utf-8") == card
            and all((folder / f.rel).is_file() for f in files))


def _staging(folder: Path) -> Path:
    """A new empty folder ``.NAME.tmp-PID`` beside ``folder`` (created with the usual
    mode), after removing the ones crashed earlier runs left."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    staging.mkdir()
    return staging


def _swap_in(staging: Path, folder: Path) -> None:
    """Replace ``folder`` by ``staging`` (two renames; a crash between them leaves no
    ``folder``, which the next run rebuilds)."""
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    if folder.exists():
        os.rename(folder, old)
    os.rename(staging, folder)
    if old.exists():
        shutil.rmtree(old)


def write_hub_text(output: str | os.PathLike, dest: str | os.PathLike | None = None, *,
                   verify: bool = True, workers: int | None = None,
                   log: Callable[[str], None] | None = None) -> HubText:
    """Write ``OUTPUT/text/``: the curated documents of a finished run as a parquet dataset
    in the Hub layout with a generated dataset card (see the module docstring).

    Args:
        output: the run's output folder (holding ``manifest.json``) or the manifest file.
        dest: the dataset folder to write (default ``text/`` beside the manifest); it is
            replaced as a whole.
        verify: check every shard's and sidecar's sha256 against the manifest before
            decoding (``False`` skips only the hashing, as in :func:`open_shards`).
        workers: shards decoded at once (threads; default ``min(4, CPUs)``).
        log: called with one line per phase.

    Returns:
        :class:`HubText`; ``reused`` when the folder was already up to date.

    Raises:
        ShardVerifyError: the manifest or a shard fails verification (one line).
        TokenizerMismatchError: the manifest's tokenizer differs from the installed one.
        HubTextError: a document cannot be decoded, or the run kept no document.
    """
    opened = open_shards(output, split=None, kind="curation", verify=False)
    m = opened.manifest
    assert isinstance(m, DatamixManifest)
    folder = Path(dest) if dest is not None else opened.root / TEXT_DIR
    files = plan_files(opened)
    if not files:
        raise HubTextError(f"{opened.manifest_path}: no document was kept; no text to write")
    licenses = _license_counts(files)
    card = dataset_card(m, sha256_file(opened.manifest_path), files, licenses)
    merged = dict(sum(licenses.values(), Counter()))
    docs = sum(f.shard.entry.documents for f in files)
    rels = [f.rel for f in files]
    if _up_to_date(folder, card, files):
        return HubText(folder=folder, files=rels, documents=docs, reused=True, licenses=merged)
    if log:
        log(f"checking {len(opened.shards)} shard(s) of {opened.manifest_path}"
            + ("" if verify else " (sha256 verification is off)"))
    check_shards(opened.shards, verify=verify, what=str(opened.manifest_path))
    enc = load_checked(m.tokenizer, str(opened.manifest_path))
    staging = _staging(folder)
    try:
        n_workers = workers or min(4, os.cpu_count() or 1)
        if log:
            log(f"writing {len(files)} parquet file(s) of text to {folder}")
        with ThreadPoolExecutor(max_workers=n_workers) as pool:
            written = sum(pool.map(lambda f: write_text_file(enc, f, staging), files))
        if written != docs:
            raise HubTextError(f"{opened.manifest_path}: wrote {written} documents, the "
                               f"manifest lists {docs}")
        atomic_write_text(staging / CARD_NAME, card)
        _swap_in(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return HubText(folder=folder, files=rels, documents=docs, reused=False, licenses=merged)
