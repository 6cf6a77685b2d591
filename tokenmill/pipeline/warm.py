"""Compile the numba kernels of the per-document stages and of the exact and fuzzy dedup
columns once, in one process, into numba's on-disk cache (``__pycache__`` beside the
sources): with a cold cache the first ``tokenmill run`` compiles the same kernels in every
Ray worker at once (about 20 CPU seconds each). ``make setup`` runs it after installing;
with a warm cache it only loads them (about 3 s), and not even that when nothing changed
since the last warm-up (:func:`warm_numba_cache` leaves a stamp naming the sources and
versions it compiled).

    python -m tokenmill.pipeline.warm
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]

WORDS = ("the of and to in is was for on that with as by at from data model time system "
         "people world city river music school water light night story house paper café naïve "
         "東京 😀 e.g. data-driven isn't 3.5 km (2019) $5").split()
SPECIAL = ("* a bullet line...", "• another bullet …", "# Heading", "javascript must be enabled.",
           "This page uses cookies.", "Visit https://example.com/a-b?x=1 now.")


def _text(seed: int) -> str:
    """A document of varied sentences and lines (so that every filter reaches its later
    rules), with the marks, bullets and words that the C4 and Gopher rules look for."""
    import random

    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))).capitalize() + "."
             for _ in range(30)]
    lines[5:5] = SPECIAL[seed % len(SPECIAL):] + SPECIAL[:seed % len(SPECIAL)]
    return "\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:])


def _fingerprint() -> str:
    """sha256 of every source file of the package (a kernel's helpers live anywhere in
    it), numba's and Python's versions: what numba's cache of these kernels depends on."""
    import numba

    h = hashlib.sha256(f"{numba.__version__} {sys.version}".encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _stamp() -> Path:
    return Path(__file__).with_name("__pycache__") / "warm.stamp"


def warm_numba_cache() -> None:
    """Run every quality filter, the length filter, normalization, language id and the
    exact and fuzzy dedup columns over a few small documents (each kernel compiled, or
    loaded, once);
    nothing when the stamp of the last warm-up names these same sources and numba's index
    files it lists are all still there.

    Raises:
        OSError: numba's cache folder cannot be written (the kernels then compile on use).
    """
    fingerprint = _fingerprint()
    try:
        stamped, *indexes = _stamp().read_text().splitlines()
        if stamped == fingerprint and all((PACKAGE / i).is_file() for i in indexes):
            return
    except (OSError, ValueError):
        pass
    _compile_kernels()
    # the stamp lists numba's index files too: a cache folder deleted since is compiled again
    indexes = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.nbi"))
    _stamp().parent.mkdir(exist_ok=True)
    _stamp().write_text("".join(f"{line}\n" for line in [fingerprint, *indexes]))


def _compile_kernels() -> None:
    from tokenmill.pipeline.dedup.exact import ExactDedup
    from tokenmill.pipeline.dedup.fuzzy import MinHashDedup
    from tokenmill.pipeline.document.language import LanguageFilter
    from tokenmill.pipeline.document.length import LengthFilter
    from tokenmill.pipeline.document.quality import build_quality_filter
    from tokenmill.pipeline.read.normalize import Normalize
    from tokenmill.pipeline.stage import Document

    def docs() -> list[Document]:
        return [Document(key=f"k{i}", source="s", text=_text(i)) for i in range(8)]

    for name in ("gopher_quality", "gopher_repetition", "c4", "fineweb"):
        list(build_quality_filter(name)(iter(docs())))
    chain = iter(docs())
    for name in ("c4", "gopher_quality", "gopher_repetition", "fineweb"):
        chain = build_quality_filter(name)(chain)  # C4 edits, the next filters gather
    list(chain)
    list(LengthFilter()(iter(docs())))
    list(Normalize()(iter(docs())))
    list(LanguageFilter()(iter(docs())))
    ExactDedup().block_columns(docs())
    MinHashDedup().block_columns(docs())


if __name__ == "__main__":
    warm_numba_cache()
