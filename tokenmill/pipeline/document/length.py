"""Basic length filters (configurable min/max characters and words)."""

from __future__ import annotations

from tokenmill.pipeline.stage import Document, DocumentFilter


class LengthFilter(DocumentFilter):
    """Remove documents outside [min_chars, max_chars] or [min_words, max_words].

    Words are whitespace-separated runs (``str.split()``). Reasons: ``too_few_chars``,
    ``too_many_chars``, ``too_few_words``, ``too_many_words``.
    """

    name = "length"
    version = 1

    def __init__(self, min_chars: int = 1, max_chars: int = 5_000_000, min_words: int = 1,
                 max_words: int = 1_000_000) -> None:
        super().__init__(min_chars=min_chars, max_chars=max_chars, min_words=min_words,
                         max_words=max_words)
        self.min_chars, self.max_chars = min_chars, max_chars
        self.min_words, self.max_words = min_words, max_words

    def reason(self, doc: Document) -> str | None:
        n = len(doc.text)
        if n < self.min_chars:
            return "too_few_chars"
        if n > self.max_chars:
            return "too_many_chars"
        words = len(doc.text.split())
        if words < self.min_words:
            return "too_few_words"
        if words > self.max_words:
            return "too_many_words"
        return None
