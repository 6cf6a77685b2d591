"""Failures a user can fix, in one line: a full disk, a missing or changed work file,
permission denied; found whatever wraps them (a Ray task's error, pyarrow's, an error
raised while handling another).

The ``tokenmill`` command prints :func:`failure_line` of such an error as
``tokenmill: ...`` and exits 2 instead of a traceback (``TOKENMILL_DEBUG=1`` shows it).
A top-level helper: it imports nothing from tokenmill's packages.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

#: errno values of a full file system or an exhausted quota.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, getattr(errno, "EFBIG", -1)}
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "OutOfDiskError",
                  "out of disk", "File too large")
_QUOTED_PATH = re.compile(r"""['"](/[^'"\n]+)['"]""")
# an intermediate of a run: OUT/work/<stage>/.../<hex digest><suffix>
_WORK_FILE = re.compile(r"[/\\]work[/\\][\w.-]+[/\\](?:.+[/\\])?[0-9a-f]{16,}[\w.-]*$")


def is_ray_wrapper(e: BaseException) -> bool:
    """A Ray task error: its message is the worker's traceback, its ``cause`` the error."""
    return any("RayTaskError" in t.__name__ for t in type(e).__mro__)


def causes(e: BaseException) -> Iterator[BaseException]:
    """Every error ``e`` is or wraps, Ray task errors left out (their ``cause`` is given
    instead): ``__cause__`` and ``__context__`` followed, at most 16 deep."""
    seen: set[int] = set()
    todo = [e]
    while todo and len(seen) < 16:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if not is_ray_wrapper(x) or getattr(x, "cause", None) is None:
            yield x
        todo += [getattr(x, "cause", None), x.__cause__, x.__context__]


def _first_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e.strerror)
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def _path_of(e: BaseException) -> str | None:
    name = getattr(e, "filename", None)
    if name:
        return str(name)
    m = _QUOTED_PATH.search(str(e))
    return m.group(1) if m else None


def _is_no_space(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in _NO_SPACE:
        return True
    if type(e).__name__ in ("OutOfDiskError", "ObjectStoreFullError"):
        return True
    text = str(e).splitlines()[-1:] if str(e) else []
    return any(t in line for line in text for t in _NO_SPACE_TEXT)


def _free(folder: str | None) -> str:
    p = Path(folder) if folder else None
    while p is not None and not p.exists() and p != p.parent:
        p = p.parent
    if p is None:
        return ""
    try:
        return f", {shutil.disk_usage(p).free:,} bytes free there"
    except OSError:
        return ""


def disk_full_line(e: BaseException, folder: str | os.PathLike | None = None) -> str | None:
    """``"FOLDER: disk full (no space left on device...)"`` when ``e`` is or wraps a full
    disk or quota, else ``None``. ``folder``: where the command writes (the output folder),
    named when the error does not name its file."""
    for x in causes(e):
        if _is_no_space(x):
            where = str(folder) if folder is not None else (_path_of(x) or "the output folder")
            return (f"{where}: disk full ({_first_line(x)}{_free(where)}); free some space "
                    "and rerun: finished work is kept and reused")
    return None


def failure_line(e: BaseException, folder: str | os.PathLike | None = None) -> str | None:
    """One line for a failure a user can fix, or ``None`` when ``e`` is none of them:

    * a full disk or quota (:func:`disk_full_line`);
    * permission denied (``PATH: permission denied``);
    * a missing file under a ``work/`` folder (removed while the run ran) or an
      intermediate whose bytes changed: named, and a rerun recomputes it.
    """
    full = disk_full_line(e, folder)
    if full:
        return full
    for x in causes(e):
        if isinstance(x, PermissionError) or (isinstance(x, OSError) and
                                              x.errno in (errno.EACCES, errno.EPERM)):
            return f"{_path_of(x) or folder or 'a file'}: permission denied"
    for x in causes(e):
        path = _path_of(x)
        if path and _WORK_FILE.search(path):
            if isinstance(x, FileNotFoundError) or "No such file" in str(x):
                return (f"work file {path} is missing (removed while the run ran?); rerun "
                        "the command: it recomputes what is missing")
            if type(x).__name__.startswith("Arrow") or isinstance(x, ValueError | OSError):
                return (f"work file {path} changed while the run ran ({_first_line(x)[:160]}); "
                        "rerun the command: it recomputes it")
    return None
