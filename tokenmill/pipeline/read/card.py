"""A dataset card's YAML front matter, read with limits: a card is someone else's file.

The card (``README.md`` of a folder laid out like a Hugging Face dataset repository) opens
with ``---``, YAML, ``---``. Its front matter may be at most :data:`MAX_FRONT_MATTER_BYTES`
bytes, and its YAML is parsed by :func:`tokenmill.boundedyaml.load` (aliases expanded at
most to a bounded number of nodes, nesting bounded), so a small card cannot stand for
gigabytes. Only the front matter is read, never the rest of the card.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tokenmill import boundedyaml

#: The largest front matter read (the Hub's biggest cards carry a few hundred KB of YAML).
MAX_FRONT_MATTER_BYTES = 4 * 1024 * 1024

_OPEN = re.compile(rb"---[ \t]*\r?\n")
_CLOSE = re.compile(rb"\r?\n---[ \t]*(\r?\n|$)")


class CardError(ValueError):
    """A dataset card that cannot be read within the limits, or whose YAML is bad."""


def front_matter(card: Path) -> dict[str, Any] | None:
    """The parsed front matter of ``card`` (a dict), or ``None`` when it has none.

    Raises:
        CardError: one line naming ``card``: front matter over the size limit or not
            closed, YAML over the expansion or depth limits, YAML that does not parse.
    """
    with open(card, "rb") as f:
        head = f.read(MAX_FRONT_MATTER_BYTES + 1024)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    opening = _OPEN.match(head)
    if opening is None:
        return None
    start = opening.end()
    end = _CLOSE.search(head, start - 1)  # from the opening's newline: `---\n---` is empty
    if end is None or end.start() > MAX_FRONT_MATTER_BYTES:
        if len(head) > MAX_FRONT_MATTER_BYTES:
            raise CardError(f"{card}: dataset card refused: its YAML front matter is over "
                            f"{MAX_FRONT_MATTER_BYTES:,} bytes")
        return None  # an opening rule and no closing one: not front matter
    if end.start() < start:
        return {}
    text = head[start:end.start()].decode("utf-8", errors="replace")
    try:
        meta = boundedyaml.load(text, str(card))
    except boundedyaml.YamlLimitError as e:
        raise CardError(str(e)) from None
    except yaml.YAMLError as e:
        raise CardError(f"{card}: unreadable YAML front matter: "
                        f"{' '.join(str(e).split())[:300]}") from None
    return meta if isinstance(meta, dict) else {}
