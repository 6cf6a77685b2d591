"""The eval-set index: every n-gram hash of a datamix's eval sets, built once, shared
with the workers through the file system (or, for an output in an object store, through
the store: each node reads its own copy).

Content-addressed: the folder ``<work>/decont/<key>`` where ``key`` is the sha256 of the
index version, the n-gram rules (``n``, ``query_ngrams``, ``overlap_ngrams``) and, per
eval set, its name, fields and the sha256 of its file's bytes (a URL's bytes as copied
into ``<work>/downloads``), or a Hub eval set's pinned commit, config and split; a rerun
with the same eval sets and rules reuses it without reading them. It holds

``hashes.npy``
    the distinct n-gram hashes, sorted, ``uint64`` (``H``,); workers memory-map it.
``buckets.npy``
    where each value of a hash's top ``bits`` starts in ``hashes``, ``uint64``
    (``2**bits + 1``,), ``bits = max(0, ceil(log2 H) - 1)`` (about two hashes a bucket):
    a lookup (:func:`contains`) reads one bucket bound and the bucket's one or two
    hashes, so its cost per n-gram does not grow with the eval sets' size, as a binary
    search's O(log H) cache misses would.
``owners.npy``
    per hash, the number of the first example (in eval-set and row order) that has the
    n-gram, ``uint32`` (``H``,).
``examples.json``
    per example number ``[eval set name, example id]``; read only when a document matches.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import xxhash

from tokenmill import objectcache, storage
from tokenmill.atomic import atomic_open
from tokenmill.pipeline.decont.text import example_ngrams
from tokenmill.pipeline.read.remote_file import is_url, local_copy

INDEX_VERSION = 2
#: the files of an index folder (``examples.json`` written last)
INDEX_FILES = ("hashes.npy", "owners.npy", "buckets.npy", "examples.json")


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: the split of a Hub eval set that names none
DEFAULT_HUB_SPLIT = "test"
_EVAL_SUFFIXES = (".jsonl", ".parquet")


def _check_suffix(p: Path, what: str) -> Path:
    if p.suffix not in _EVAL_SUFFIXES:
        raise ValueError(f"{what} {p}: expected a .jsonl or .parquet file")
    return p


def eval_file(path: str, root: str | None, downloads: str | os.PathLike | None = None
              ) -> Path:
    """The local file of eval set file ``path``: relative to ``root`` (a folder or a URL)
    unless absolute, or a URL, copied once into ``downloads`` (:func:`local_copy`). Raises
    ``ValueError`` (one line naming the file or URL) when it is missing, unreadable or
    neither .jsonl nor .parquet."""
    if not is_url(path) and root is not None and is_url(root) and not Path(path).is_absolute():
        path = storage.join(root, path)  # relative to a data root in an object store
    if is_url(path):
        if Path(path.split("?")[0]).suffix not in _EVAL_SUFFIXES:
            raise ValueError(f"eval set file {path}: expected a .jsonl or .parquet file")
        if downloads is None:
            raise ValueError(f"eval set file {path}: a URL needs a downloads folder")
        return Path(local_copy(path, downloads, "eval set file"))
    p = Path(path) if Path(path).is_absolute() or root is None else Path(root) / path
    if not p.is_file():
        raise ValueError(f"eval set file {p}: not found")
    return _check_suffix(p, "eval set file")


def _hub_files(es: dict[str, Any]) -> list[Path]:
    """The local copies (HF cache) of Hub eval set ``es``'s data files of its config and
    split, in ``datasets``' order. Raises ``ValueError`` (one line naming the eval set)."""
    from tokenmill.pipeline.config import SourceConfig
    from tokenmill.pipeline.read.hub import fetch_card, fetch_split_files

    repo_id, _, commit = es["hub"].partition("@")
    what = f"eval set {es['name']!r}: Hub dataset {es['hub']}"
    chosen = {"config": es["config"]} if es.get("config") else {}
    src = SourceConfig(name=es["name"], hub=es["hub"],
                       split=es.get("split") or DEFAULT_HUB_SPLIT, **chosen)
    try:
        folder = fetch_card(repo_id, commit)
        rels = fetch_split_files(folder, src, commit)
    except Exception as e:  # noqa: BLE001 (any Hub client's error becomes one line)
        msg = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{what}: cannot be read ({type(e).__name__}: {msg})") from None
    if not rels:
        raise ValueError(f"{what}: no data files in split {src.split!r}")
    return [_check_suffix(folder / rel, f"{what}: data file") for rel in rels]


def eval_files(es: dict[str, Any], root: str | None,
               downloads: str | os.PathLike | None = None) -> list[Path]:
    """The local files of eval set ``es`` (an ``EvalSetConfig`` dump), in row order."""
    if es.get("hub"):
        return _hub_files(es)
    return [eval_file(es["path"], root, downloads)]


def _origin_id(es: dict[str, Any], root: str | None,
               downloads: str | os.PathLike | None) -> list[Any]:
    """What identifies an eval set's rows: a Hub dataset's commit, config and split (a
    40-hex commit pins its bytes, so a rerun needs no network), else its file's sha256."""
    if es.get("hub"):
        return ["hub", es["hub"], es.get("config"), es.get("split") or DEFAULT_HUB_SPLIT]
    p = eval_file(es["path"], root, downloads)
    st = p.stat()
    return ["sha256", _file_sha256(str(p), st.st_size, st.st_mtime_ns)]


def index_key(decont: dict[str, Any], root: str | None,
              downloads: str | os.PathLike | None = None) -> str:
    """sha256 naming the index of the decontamination config ``decont`` (a
    ``DecontaminationConfig`` dump), eval files relative to ``root``, URLs copied into
    ``downloads``."""
    sets = [[es["name"], es["answer_field"], es["prompt_field"], es["id_field"],
             *_origin_id(es, root, downloads)] for es in decont["eval_sets"]]
    rules = [decont["n"], decont["query_ngrams"], decont["overlap_ngrams"]]
    blob = json.dumps([INDEX_VERSION, rules, sets], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _rows(path: Path, fields: list[str]) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        missing = [f for f in fields if f not in table.column_names]
        if missing:
            raise ValueError(f"eval set file {path}: no column {missing[0]!r}")
        yield from table.select(fields).to_pylist()
        return
    with open(path, encoding="utf-8") as f:
        for row, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"eval set file {path}: row {row}: invalid JSON ({e.msg})") \
                    from None
            missing = [k for k in fields if not isinstance(rec, dict) or k not in rec]
            if missing:
                raise ValueError(f"eval set file {path}: row {row}: no key {missing[0]!r}")
            yield rec


def _labels(value: Any, path: Path, row: int) -> list[str]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"eval set file {path}: row {row}: the answer is not a string "
                         f"or a list of strings")
    return values


def examples(es: dict[str, Any], root: str | None,
             downloads: str | os.PathLike | None = None
             ) -> Iterator[tuple[str, list[str], str | None]]:
    """``(example id, labels, query)`` of each row of eval set ``es`` (an
    ``EvalSetConfig`` dump; its files as :func:`eval_files` gives them). Raises
    ``ValueError`` naming the file and row."""
    fields = [f for f in (es["answer_field"], es["prompt_field"], es["id_field"]) if f]
    number = 0  # the example's row number over the set's files, its default id
    for path in eval_files(es, root, downloads):
        for row, rec in enumerate(_rows(path, fields)):
            ex_id = str(rec[es["id_field"]]) if es["id_field"] else str(number)
            number += 1
            query = rec[es["prompt_field"]] if es["prompt_field"] else None
            if query is not None and not isinstance(query, str):
                raise ValueError(f"eval set file {path}: row {row}: the prompt is not a "
                                 "string")
            yield ex_id, _labels(rec[es["answer_field"]], path, row), query


def _refuse_empty(es: dict[str, Any], examples: int, ngrams: int, n: int) -> None:
    """An eval set that can match nothing would make the stage a silent no-op."""
    what = es.get("path") or es.get("hub")
    if examples == 0:
        raise ValueError(f"eval set {es['name']} ({what}): no examples")
    if ngrams == 0:
        raise ValueError(f"eval set {es['name']} ({what}): none of its {examples:,} "
                         f"examples has {n} words, so none can match (decontamination.n)")


def _build(decont: dict[str, Any], root: str | None, folder: Path,
           downloads: str | os.PathLike | None) -> None:
    hashes, owners = array("Q"), array("I")  # 8 + 4 bytes an n-gram, not Python ints
    names: list[list[str]] = []
    rules = (decont["n"], decont["query_ngrams"], decont["overlap_ngrams"])
    h64 = xxhash.xxh64_intdigest
    for es in decont["eval_sets"]:
        count, before = 0, len(hashes)
        for ex_id, labels, query in examples(es, root, downloads):
            grams = [g for label in labels for g in example_ngrams(label, query, *rules)]
            hashes.extend(h64(g.encode()) for g in grams)
            owners.extend(itertools.repeat(len(names), len(grams)))
            names.append([es["name"], ex_id])
            count += 1
        _refuse_empty(es, count, len(hashes) - before, decont["n"])
    h = np.frombuffer(hashes, dtype=np.uint64)
    o = np.frombuffer(owners, dtype=np.uint32)
    order = np.lexsort((o, h))  # by hash, then the first example
    h, o = h[order], o[order]
    first = np.ones(len(h), dtype=bool)
    first[1:] = h[1:] != h[:-1]
    folder.mkdir(parents=True, exist_ok=True)
    h, o = h[first], o[first]
    bits = max(0, int(len(h) - 1).bit_length() - 1)
    edges = np.arange(2 ** bits + 1, dtype=np.uint64) << np.uint64(64 - bits) \
        if bits else np.array([0, 0], dtype=np.uint64)
    starts = np.searchsorted(h, edges).astype(np.uint64)
    starts[-1] = len(h)  # the last edge wrapped to 0
    for name, arr in (("hashes.npy", h), ("owners.npy", o), ("buckets.npy", starts)):
        with atomic_open(folder / name) as f:
            np.save(f, arr)
    with atomic_open(folder / "examples.json", "w") as f:  # written last: the index is whole
        json.dump(names, f)


def ensure_index(decont: dict[str, Any], root: str | None,
                 work: str | os.PathLike) -> str:
    """The index of ``decont`` for the run whose ``work/`` folder is ``work``, built
    unless it exists (eval files given by URL are copied into ``work/downloads``).

    For a local ``work``: the index folder ``work/decont/<key>``. For a URL: the index
    is built in this node's staging copy and committed to ``work/decont/<key>`` in the
    store (:func:`tokenmill.objectcache.commit_files`), whose URL is returned: a worker on
    any node reads its own copy of it (:func:`load_index`). Raises ``ValueError`` (one
    line) for an eval set that cannot be read, ``StorageError`` for a store that cannot
    be written."""
    local = storage.local_dir(work)
    downloads = local / "downloads"
    key = index_key(decont, root, downloads)
    folder = local / "decont" / key
    url = storage.join(str(work), "decont", key) if storage.is_url(work) else None
    if url is not None and objectcache.is_committed(url):
        return url
    if not (folder / "examples.json").is_file():
        _build(decont, root, folder, downloads)
    if url is None:
        return str(folder)
    objectcache.commit_files({n: folder / n for n in INDEX_FILES}, url)
    return url


def _local(folder: str | os.PathLike) -> Path:
    """The local folder of an index: itself, or this node's copy of one in a store."""
    return objectcache.folder_copy(str(folder)) if storage.is_url(folder) else Path(folder)


def load_index(folder: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(hashes, owners, buckets)`` of an index (a local folder or the URL
    :func:`ensure_index` gave), memory-mapped read-only."""
    local = _local(folder)
    return tuple(np.load(local / f"{name}.npy", mmap_mode="r")  # type: ignore
                 for name in ("hashes", "owners", "buckets"))


def contains(hashes: np.ndarray, buckets: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Per hash of ``query`` (``uint64``, (``Q``,)) its position in ``hashes``, or -1:
    ``int64`` (``Q``,). ``hashes``/``buckets`` as :func:`load_index` gives them."""
    bits = (len(buckets) - 1).bit_length() - 1
    b = (query >> np.uint64(64 - bits)).astype(np.int64) if bits else \
        np.zeros(len(query), np.int64)
    lo = buckets[b].astype(np.int64)
    size = buckets[b + 1].astype(np.int64) - lo
    found = np.full(len(query), -1, dtype=np.int64)
    for k in range(int(size.max()) if len(size) else 0):  # buckets hold ~2 hashes
        live = np.flatnonzero((size > k) & (found < 0))
        at = lo[live] + k
        hit = hashes[at] == query[live]
        found[live[hit]] = at[hit]
    return found


def load_examples(folder: str | os.PathLike) -> list[list[str]]:
    """Per example number ``[eval set name, example id]`` (``folder`` as in
    :func:`load_index`)."""
    return json.loads((_local(folder) / "examples.json").read_text())
