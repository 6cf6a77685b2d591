"""Normalization: Unicode NFC, line breaks unified, other control characters stripped.

Every line or page separator becomes ``\\n``, so words on either side are never glued
together: CRLF and a lone CR (old Mac line ends), VT (U+000B), FF (U+000C, page breaks in
text exported from PDFs and word processors), NEL (U+0085, EBCDIC line ends), LINE
SEPARATOR (U+2028) and PARAGRAPH SEPARATOR (U+2029), i.e. the line boundaries of
``str.splitlines`` other than the file/group/record separators U+001C..U+001E. Other
control characters (Unicode category Cc but TAB) are deleted.

Rejects documents whose text holds lone surrogates (``invalid_unicode``; JSON escapes
like ``"\\ud800"`` produce them) and documents empty or whitespace-only after
normalization (``empty``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator

from tokenmill.pipeline.stage import Document, DocumentStage

_NEWLINES = (0x0B, 0x0C, 0x0D, 0x85, 0x2028, 0x2029)
# Unicode category Cc: U+0000..U+001F and U+007F..U+009F: line breaks → LF, TAB and LF
# kept, the rest deleted.
_CONTROL: dict[int, str | None] = {
    c: None for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)] if c not in (9, 10)}
_CONTROL.update({c: "\n" for c in _NEWLINES})
# what normalize_text may change, and lone surrogates: texts without any (nearly all)
# skip the character-by-character translation
_SPECIAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def normalize_text(text: str) -> str:
    """NFC-normalize ``text``, turn every line/page separator (CRLF, CR, VT, FF, NEL,
    U+2028, U+2029) into ``\\n`` and delete the other control characters but ``\\t``."""
    if _SPECIAL.search(text) is not None:
        if "\r\n" in text:
            text = text.replace("\r\n", "\n")
        text = text.translate(_CONTROL)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return text


class Normalize(DocumentStage):
    name = "normalize"
    version = 2  # 2: line/page separators become "\\n" instead of being deleted

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            if _SPECIAL.search(doc.text) is not None:  # the encode check only then
                try:
                    doc.text.encode("utf-8")
                except UnicodeEncodeError as e:
                    self.reject(doc, "invalid_unicode",
                                detail=f"{e.reason} at char {e.start}: {doc.text[e.start]!r}")
                    continue
            doc.text = normalize_text(doc.text)
            if not doc.text or doc.text.isspace():
                self.reject(doc, "empty")
                continue
            yield doc
