"""One formatter for pydantic validation errors: the file, then each wrong field by its path
with what was expected, at most three lines, no pydantic dump and no documentation links::

    runs/tiny.yaml: invalid train config
      stpes: unknown field (did you mean 'steps'?)
      schedule: expected 'cosine' or 'trapezoid', got 'linear'

Used by the train config (:mod:`tokenmill.train.config`), the manifest reader
(:mod:`tokenmill.manifests.verify`) and the ``tokenmill`` command's error printer
(:mod:`tokenmill.cli`). A top-level helper: it imports nothing from tokenmill's packages.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import ValidationError

#: An error prints at most this many lines: the file (or what failed), then the fields.
MAX_ERROR_LINES = 3

# Shape problems (a required field missing, an unknown field: often one typo) come before
# wrong values; within each group, pydantic's order (the model's field order).
_ORDER = {"missing": 0, "extra_forbidden": 1}


def _what(e: dict, path: str, fields: list[str]) -> str:
    """What was wrong with one pydantic error ``e`` at ``path``, in words."""
    kind, msg = e["type"], str(e["msg"])
    if kind == "extra_forbidden":
        near = difflib.get_close_matches(path, fields, n=1) if fields else []
        return "unknown field" + (f" (did you mean {near[0]!r}?)" if near else "")
    if kind == "missing":
        return "required, missing"
    if kind.startswith("value_error") or kind == "assertion_error":
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    got = repr(e.get("input"))
    got = got[:40] + "..." if len(got) > 43 else got
    return msg.replace("Input should be", "expected", 1) + f", got {got}"


def field_lines(err: ValidationError, room: int = MAX_ERROR_LINES - 1,
                fields: Iterable[str] | None = None) -> list[str]:
    """``err`` as ``"  path: what was expected, got what"`` lines, one per wrong field.

    Missing fields come first, then unknown fields (each with the closest name in
    ``fields``, when given: ``unknown field (did you mean 'steps'?)``), then wrong values.

    Args:
        err: a pydantic ``ValidationError``.
        room: at most this many lines (>= 1); when there are more wrong fields, the last
            line counts the rest (``"  ... and 3 more wrong fields"``).
        fields: the model's field names, for the suggestion after an unknown field.

    Returns:
        at most ``room`` lines, indented by two spaces.
    """
    names = list(fields or [])
    errors = sorted(err.errors(include_url=False), key=lambda e: _ORDER.get(e["type"], 2))
    lines = []
    for e in errors:
        path = ".".join(str(x) for x in e["loc"]) or "(top level)"
        lines.append(f"  {path}: {_what(e, path, names)}")
    room = max(1, room)
    if len(lines) > room:
        lines = lines[: room - 1] + [f"  ... and {len(lines) - room + 1} more wrong fields"]
    return lines


def error_lines(header: str, err: ValidationError, fields: Iterable[str] | None = None,
                max_lines: int = MAX_ERROR_LINES) -> list[str]:
    """``header`` (the file and what it is: ``"cfg.yaml: invalid train config"``) followed by
    :func:`field_lines` of ``err``: at most ``max_lines`` lines in all."""
    return [header, *field_lines(err, max_lines - 1, fields)]


def one_line(err: ValidationError, fields: Iterable[str] | None = None) -> str:
    """:func:`field_lines` on one line (``"name: required, missing; ... and 2 more wrong
    fields"``), for messages that must stay single-line (shard and manifest checks)."""
    return "; ".join(s.strip() for s in field_lines(err, MAX_ERROR_LINES - 1, fields))
