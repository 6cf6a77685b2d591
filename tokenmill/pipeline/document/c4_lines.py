"""C4's line checks on the phrases of a line, in numba over the text's code points.

C4 (Raffel et al. 2020, section 2.2; datatrove ``C4QualityFilter``) goes over the lines
still kept after its word and punctuation checks, in order: a line holding ``lorem
ipsum`` (lower-cased) ends the document, else one holding ``javascript`` is dropped, else
one holding ``{`` ends the document, else one holding a cookie/privacy/terms-of-use phrase
is dropped. :func:`decide_lines` does that for all lines in one call, matching the ASCII
phrases case-insensitively on code points: the same as searching ``line.lower()`` as long
as no character of those lines lower-cases to an ASCII letter from outside ASCII (the
Kelvin sign, a dotted capital I): for such a line it answers "undecided" and the caller
reads the text in Python.
"""

from __future__ import annotations

import numba
import numpy as np

from tokenmill.pipeline.document.analysis import LOWER_ASCII

#: verdict codes (C4QualityFilter's line drop reasons) and results of decide_lines
JAVASCRIPT, POLICY = 4, 5
KEEP, LOREM, CURLY, UNDECIDED = 0, 1, 2, 3

def phrase_table(policy: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(uint32 code points of the phrases ``lorem ipsum``, ``javascript``, ``{`` and then
    ``policy`` (lower-case ASCII) one after another, int64 offsets: phrase ``k`` is
    ``[offsets[k], offsets[k + 1])``).

    Raises:
        ValueError: a phrase that is not lower-case ASCII.
    """
    phrases = ("lorem ipsum", "javascript", "{", *policy)
    if not all(p.isascii() and p == p.lower() for p in phrases):
        raise ValueError("C4 phrases must be lower-case ASCII")
    cps = np.array([ord(ch) for p in phrases for ch in p], np.uint32)
    offsets = np.cumsum([0] + [len(p) for p in phrases]).astype(np.int64)
    return cps, offsets


@numba.njit(cache=True, inline="always")
def _holds(cp, a, b, cps, p0, p1):
    """Whether ``cp[a:b]``, ASCII letters lower-cased, holds ``cps[p0:p1]``."""
    n = p1 - p0
    for i in range(a, b - n + 1):
        ok = True
        for k in range(n):
            c = cp[i + k]
            if c >= 65 and c <= 90:
                c += 32
            if c != cps[p0 + k]:
                ok = False
                break
        if ok:
            return True
    return False


@numba.njit(cache=True)
def decide_lines(cp, flags, starts, ends, verdict, cps, offsets, checks):
    """Run the phrase checks over the lines ``cp[starts[j]:ends[j]]`` whose ``verdict`` is
    0, in order; ``checks``: bool[4] lorem ipsum, javascript, ``{``, policy on. Sets
    ``verdict`` to ``JAVASCRIPT`` / ``POLICY`` for the lines dropped. Returns (``KEEP``,
    -1), (``LOREM`` or ``CURLY``, the line that ends the document) or (``UNDECIDED``, the
    first open line holding a character that lower-cases to ASCII from outside it)."""
    n_phrases = offsets.shape[0] - 1
    for j in range(starts.shape[0]):
        if verdict[j] != 0:
            continue
        a, b = starts[j], ends[j]
        for i in range(a, b):
            if cp[i] >= 128 and flags[cp[i]] & LOWER_ASCII:
                return UNDECIDED, j
        if checks[0] and _holds(cp, a, b, cps, offsets[0], offsets[1]):
            return LOREM, j
        if checks[1] and _holds(cp, a, b, cps, offsets[1], offsets[2]):
            verdict[j] = JAVASCRIPT
            continue
        if checks[2] and _holds(cp, a, b, cps, offsets[2], offsets[3]):
            return CURLY, j
        if checks[3]:
            for k in range(3, n_phrases):
                if _holds(cp, a, b, cps, offsets[k], offsets[k + 1]):
                    verdict[j] = POLICY
                    break
    return KEEP, -1
