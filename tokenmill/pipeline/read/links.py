"""Listing a source folder without leaving it: symbolic links are checked, not trusted.

A source folder is often someone else's (an archive unpacked, a repository cloned), and a
link in it may point anywhere on the machine (``passwd.txt -> /etc/passwd``). Every link met
while listing, at any depth, is resolved to its final target (through chains of links):

* a link to a file inside the source folder (or inside one of ``allowed`` folders: the
  Hugging Face cache's blob store, where a snapshot's files are links) is listed like a
  file;
* a link to a folder is never descended (its files, when inside, are listed at their own
  path; a link to an ancestor would loop);
* a link whose target is outside, missing, or a loop is skipped and reported as a
  :class:`SkippedLink` naming the link and its target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SkippedLink:
    """A link of a source folder that was not read."""

    rel: str  # the link, relative to the source folder (posix)
    target: str  # where it points (resolved as far as it goes)
    why: str  # "outside the source folder", "a folder", "broken", "a loop"


def _inside(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _check_link(path: str, folders: list[str]) -> tuple[str, str | None]:
    """``(target, why)`` of the link ``path``: ``why`` is ``None`` when it may be read."""
    try:
        target = os.path.realpath(path, strict=True)
    except OSError as e:  # missing target, or a loop of links
        loose = os.path.realpath(path)
        return loose, ("a loop of links" if "loop" in str(e).lower() or
                       getattr(e, "errno", None) == 40 else "broken (no such target)")
    if not _inside(target, folders):
        return target, "outside the source folder"
    if os.path.isdir(target):
        return target, "a folder"
    return target, None


def walk_files(root: Path, allowed: tuple[Path, ...] = ()) -> tuple[list[str], list[SkippedLink]]:
    """Every regular file under ``root`` (links checked as the module says), sorted.

    Args:
        root: the source folder (resolved: no link in its own path).
        allowed: folders besides ``root`` that links may point into.

    Returns:
        (posix paths relative to ``root``, sorted; the links skipped, sorted by path).
    """
    folders = [os.path.realpath(root), *(os.path.realpath(a) for a in allowed)]
    files: list[str] = []
    skipped: list[SkippedLink] = []
    for top, dirs, names in os.walk(root, followlinks=False):
        rel_top = os.path.relpath(top, root)
        for d in list(dirs):
            full = os.path.join(top, d)
            if os.path.islink(full):
                target, why = _check_link(full, folders)
                if why != "a folder":  # a linked folder inside is listed at its own path
                    skipped.append(SkippedLink(_rel(rel_top, d), target, why or "a folder"))
        for n in names:
            full = os.path.join(top, n)
            if os.path.islink(full):
                target, why = _check_link(full, folders)
                if why is not None:
                    skipped.append(SkippedLink(_rel(rel_top, n), target, why))
                    continue
            elif not os.path.isfile(full):
                continue  # sockets, fifos, devices: never data
            files.append(_rel(rel_top, n))
    return sorted(files), sorted(skipped, key=lambda s: s.rel)


def _rel(top: str, name: str) -> str:
    return Path(name).as_posix() if top == "." else Path(top, name).as_posix()
