"""Every document of every real corpus under ``../shared/data/corpora``, as text.

Test helper for the legality tables (kept here so that it does not depend on the pipeline's
readers, which are written in parallel). Formats: ``*.jsonl[.gz]`` / ``*.json.gz`` lines with a
``text`` field, ``*.txt`` files (UTF-8, else cp1252), a JSON array of strings, and WARC
records (each record block decoded as UTF-8 with replacement). Dataset cards (README.md) and
CSV metadata are not documents.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def _warc_blocks(path: Path) -> Iterator[bytes]:
    with gzip.open(path, "rb") as f:
        data = f.read()
    i = 0
    while True:
        j = data.find(b"WARC/1.0\r\n", i)
        if j < 0:
            return
        end = data.find(b"\r\n\r\n", j)
        if end < 0:
            return
        length = 0
        for line in data[j:end].split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        block = data[end + 4 : end + 4 + length]
        yield block
        i = end + 4 + length


def iter_corpus_documents(root: Path) -> Iterator[tuple[str, str]]:
    """Yield ``(key, text)`` for every document under ``root`` (sorted, deterministic)."""
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == "README.md" or path.suffix == ".csv":
            continue
        rel = str(path.relative_to(root))
        name = path.name
        if name.endswith((".jsonl.gz", ".json.gz", ".jsonl")):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as f:
                for k, line in enumerate(f):
                    if line.strip():
                        yield f"{rel}#{k}", json.loads(line)["text"]
        elif name.endswith(".json"):
            for k, s in enumerate(json.loads(path.read_text(encoding="utf-8"))):
                if isinstance(s, str):
                    yield f"{rel}#{k}", s
        elif name.endswith(".warc.gz"):
            for k, block in enumerate(_warc_blocks(path)):
                yield f"{rel}#{k}", block.decode("utf-8", errors="replace")
        else:
            yield rel, _decode(path.read_bytes())
