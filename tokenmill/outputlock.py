"""One run per output folder: a lock file naming its holder.

``OUT/.tokenmill.lock`` is created only if absent (``O_CREAT | O_EXCL``, atomic on a local
file system) and holds its holder as JSON: pid, host, process start time, since when, and
the command. A second run finds it and refuses in one line naming the holder. The lock is
removed when its holder exits (normally, on an error, on Ctrl-C); a lock whose holder died
without removing it (killed, machine crash) is stale when its host is this machine and no
process with its pid and start time runs any more, and is then taken over. A lock of another
host is never taken over: its holder cannot be checked from here.

A process may take the lock of a folder it already holds (nested calls: the command and
the library function both take it). A top-level helper: it imports nothing from
tokenmill's packages.

An output folder in an object store (a URL, :mod:`tokenmill.storage`) has a lock object
at the same name, with the same holder record and the same stale rule. A store has no
create-if-absent here, so the lock is written when absent and then read back: two runs
started within the same moment may both find themselves holding it. It guards against the
common mistake (a second run on a busy folder), not against a race; a lock object whose
holder ran on another host is never taken over (delete it by hand once that run is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tokenmill import storage

LOCK_NAME = ".tokenmill.lock"

_held: dict[str, int] = {}  # lock path -> nesting depth, in this process
_created: set[str] = set()  # lock paths whose folder acquire() made (removed if left empty)


class OutputLockedError(RuntimeError):
    """The output folder is held by another run (the message names it)."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(holder: dict) -> bool:
    pid = int(holder.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    recorded = holder.get("start")
    return recorded is None or _start_time(pid) in (None, recorded)


def _describe(holder: dict, path: Path) -> str:
    since = holder.get("since", "?")
    cmd = holder.get("command") or "?"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {since} "
            f"({cmd}); wait for it to finish, or remove {path} if that run is gone")


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid()),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": storage.redact(" ".join(["tokenmill", *sys.argv[1:]]))[:300]}


def _try_create(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_me(), f)
    except BaseException:  # a full disk, say: never leave an empty lock behind
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return True


def _read_holder(path: Path) -> dict | None:
    """The lock's holder, ``{}`` for a lock being written or unreadable, ``None`` if gone."""
    try:
        return json.loads(path.read_text() or "{}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def _acquire_url(url: str) -> str:
    """:func:`acquire` for an output folder in an object store (see the module's note)."""
    storage.check_bucket(url)
    key = storage.join(url, LOCK_NAME)
    if key in _held:
        _held[key] += 1
        return key
    for _ in range(5):
        holder = _read_url_holder(key)
        if holder is None or (holder and holder.get("host") == socket.gethostname()
                              and not _alive(holder)):
            mine = _me()
            storage.write_bytes(key, json.dumps(mine).encode())
            time.sleep(0.2)  # a run that wrote at the same moment shows up in the read
            if _read_url_holder(key) == mine:
                _held[key] = 1
                return key
            continue
        raise OutputLockedError(f"output folder {storage.redact(url)} is in use by another "
                                f"run: {_describe(holder, Path(storage.redact(key)))}")
    raise OutputLockedError(f"output folder {storage.redact(url)}: could not take its lock")


def _read_url_holder(key: str) -> dict | None:
    """The lock object's holder, ``None`` when there is no lock object."""
    if not storage.exists(key):
        return None
    try:
        return json.loads(storage.read_bytes(key) or b"{}")
    except ValueError:
        return {}


def acquire(out_dir: str | os.PathLike) -> Path | str:
    """Take the lock of ``out_dir`` (created if missing); returns the lock file's path
    (for an object-store URL, the lock object's URL).

    Raises:
        OutputLockedError: another live run holds it (one line naming pid, host, since
            when and its command).
        StorageError: an object-store folder cannot be reached (one line naming it).
    """
    if storage.is_url(out_dir):
        return _acquire_url(storage.normalize(out_dir))
    out = Path(out_dir).resolve()
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    if str(path) in _held:
        _held[str(path)] += 1
        return path
    for attempt in range(50):
        if _try_create(path):
            _held[str(path)] = 1
            if created:
                _created.add(str(path))
            return path
        holder = _read_holder(path)
        if holder is None:
            continue  # released meanwhile
        if not holder and attempt < 10:
            time.sleep(0.05)  # its holder is writing it
            continue
        mine = holder.get("host") == socket.gethostname()
        if (holder and mine and not _alive(holder)) or (not holder and _age(path) > 10):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # stale: its holder died without removing it
            continue
        raise OutputLockedError(f"output folder {out} is in use by another run: "
                                + _describe(holder, path))
    raise OutputLockedError(f"output folder {out}: could not take its lock {path}")


def _age(path: Path) -> float:
    """Seconds since ``path`` was last written (0 when it is gone)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def release(path: Path | str) -> None:
    """Give back a lock taken by :func:`acquire` (the file goes at the outermost release)."""
    depth = _held.get(str(path), 0) - 1
    if depth > 0:
        _held[str(path)] = depth
        return
    _held.pop(str(path), None)
    if storage.is_url(path):
        holder = _read_url_holder(str(path))
        if holder and holder.get("pid") == os.getpid():
            storage.remove(str(path))
        return
    holder = _read_holder(path)
    if holder and holder.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if str(path) in _created:  # a run that wrote nothing leaves no folder it made behind
        _created.discard(str(path))
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only when empty


@contextlib.contextmanager
def output_lock(out_dir: str | os.PathLike) -> Iterator[Path | str]:
    """Hold the lock of ``out_dir`` for the ``with`` block (see :func:`acquire`)."""
    path = acquire(out_dir)
    try:
        yield path
    finally:
        release(path)
