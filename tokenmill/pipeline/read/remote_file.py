"""A local copy of a file given by URL (a classifier model, say), through ``fsspec``.

Any URL fsspec opens works (``http(s)://``, ``s3://``, ``gs://``, ``hf://`` with their
packages and each system's standard credentials); the copy is made once per output folder,
atomically, under ``work/downloads/`` and named by the URL's sha256, so a rerun reads no
byte again and a broken download leaves nothing behind. What the file holds is then
identified by its bytes (its sha256), never by its URL.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tokenmill.atomic import atomic_open


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
    import fsspec

    name = url.rstrip("/").rsplit("/", 1)[-1] or "file"
    dest = Path(folder) / hashlib.sha256(url.encode()).hexdigest()[:16] / name
    if dest.is_file():
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with fsspec.open(url, "rb") as src, atomic_open(dest) as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except Exception as e:  # noqa: BLE001 (any client's error becomes one line)
        raise ValueError(f"{what} {url}: cannot be read ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return str(dest)
