"""A local copy of a file given by URL (a classifier model, say), through ``fsspec``.

Any URL :mod:`tokenmill.storage` reads works (``s3://`` and ``gs://`` through pyarrow,
``http(s)://``, ``hf://`` and others through ``fsspec``, with each system's standard
credentials); the copy is made once per output folder,
atomically, under ``work/downloads/`` and named by the URL's sha256, so a rerun reads no
byte again and a broken download leaves nothing behind. What the file holds is then
identified by its bytes (its sha256), never by its URL.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tokenmill import storage


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return "://" in path


def local_copy(url: str, folder: str | Path, what: str) -> str:
    """The local path of ``url``'s bytes, downloaded into ``folder`` if not there yet.

    Args:
        url: the file's URL; a local path is returned unchanged.
        folder: where copies live (``OUT/work/downloads``).
        what: how an error names the file (``"classifier model"``).

    Raises:
        ValueError: one line naming ``what`` and the URL when it cannot be read.
    """
    if not is_url(url):
        return url
    name = url.rstrip("/").rsplit("/", 1)[-1] or "file"
    dest = Path(folder) / hashlib.sha256(url.encode()).hexdigest()[:16] / name
    if dest.is_file():
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        storage.download(url, dest)
    except storage.StorageError as e:  # already one line naming the URL
        raise ValueError(f"{what} {e}") from None
    except Exception as e:  # noqa: BLE001 (any client's error becomes one line)
        raise ValueError(f"{what} {storage.redact(url)}: cannot be read "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                         ) from None
    return str(dest)
