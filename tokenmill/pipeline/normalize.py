"""Normalization: Unicode NFC, control characters stripped (newline and tab kept).

Rejects documents whose text holds lone surrogates (``invalid_unicode``; JSON escapes
like ``"\\ud800"`` produce them) and documents empty or whitespace-only after
normalization (``empty``). CR is a control character, so CRLF becomes LF.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Iterator

from tokenmill.pipeline.step import Document, PipelineStep

# Unicode category Cc: U+0000..U+001F and U+007F..U+009F, less TAB and LF.
_CONTROL = {c: None for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)] if c not in (9, 10)}


def normalize_text(text: str) -> str:
    """NFC-normalize ``text`` and delete control characters other than ``\\n`` and ``\\t``."""
    text = text.translate(_CONTROL)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return text


class Normalize(PipelineStep):
    name = "normalize"
    version = 1

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            try:
                doc.text.encode("utf-8")
            except UnicodeEncodeError as e:
                self.reject(doc, "invalid_unicode",
                            detail=f"{e.reason} at char {e.start}: {doc.text[e.start]!r}")
                continue
            doc.text = normalize_text(doc.text)
            if not doc.text.strip():
                self.reject(doc, "empty")
                continue
            yield doc
