"""Shared by the legality tests: token ids by bytes, and table rows checked against the
plain-Python reference build of the same definition."""

from __future__ import annotations

import numpy as np

from tokenmill.tokenizers.legality import analyze, reference_row
from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks


def token_id(enc, b: bytes) -> int:
    """The id of the token whose bytes are ``b`` (KeyError if it is not one token)."""
    return mergeable_ranks(enc)[b]


def check_rows_against_reference(table, name, rows):
    an = analyze(name)
    for a in rows:
        ref = reference_row(an, int(a))
        got = table.allowed_next(int(a))
        bad = np.flatnonzero(ref != got)
        assert len(bad) == 0, (
            f"{name} row {a} {an.tokens[a]!r}: {len(bad)} columns differ from the reference, "
            f"e.g. {[(int(b), an.tokens[b], bool(ref[b])) for b in bad[:5]]}")
