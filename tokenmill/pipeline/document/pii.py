"""PII stage: email addresses and IP addresses replaced by placeholders.

API::

    from tokenmill.pipeline.document.pii import PIIRedact, redact
    text, edits = redact("mail me at jane@doe.org from 8.8.8.8", PIIRedact())
    stage = PIIRedact(emails=True, ipv4=True, ipv6=True)
    kept = list(stage(docs))   # every document kept, its text redacted

Emails and IPv4 follow datatrove's ``PIIFormatter`` (``datatrove.pipeline.formatters.pii``,
as used for FineWeb, Penedo et al. 2024): the same regular expressions applied in the same
order (emails first, then IPv4 on the result), the same validator (an IPv4 match is
replaced only when :attr:`ipaddress.IPv4Address.is_global`, with ``only_public``), and the
same default placeholders used in turn. datatrove's turn counter runs across all the
documents a worker formats, so its output depends on how documents are spread over
workers; here the turn restarts in every document (the ``k``-th replacement of a class in
a document is ``replacements[k % len(replacements)]``), which is what a fresh datatrove
formatter per document gives, whatever the number of workers.

IPv6 goes beyond datatrove: a candidate (hex groups and colons, at least two colons) is
replaced when :func:`ipaddress.ip_address` parses it, it is global and in the global
unicast block ``2000::/3`` (RFC 4291; this keeps ``Class::method`` and ``a::b`` out),
after the IPv4 pass, by documentation addresses (``2001:db8::/32``, RFC 3849).

Nothing is lost: each replaced span becomes an edit record in the quarantine
(``stage="pii"``, ``reason="pii:edit:<class>"``, ``text`` the original span, ``detail``
JSON ``{"start", "end", "replacement"}`` with ``start``/``end`` character offsets in the
document's text before this stage). The number of replacements per class goes to the
manifest (``pii_replacements`` of each source).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tokenmill.pipeline.stage import Document, DocumentStage, Rejection

EMAIL_RE = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4_RE = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
#: cheap necessary conditions of a match: a text failing one is not scanned by the full
#: pattern (an email has an "@"; an IPv4 match is four dotted runs of 1-3 digits)
_IPV4_CANDIDATE = re.compile(r"\d\.\d{1,3}\.\d{1,3}\.\d")
IPV6_RE = re.compile(r"(?<![0-9A-Za-z:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Za-z:])")

#: datatrove's defaults (example.com/org are reserved for examples)
EMAIL_REPLACEMENTS = ("email@example.com", "firstname.lastname@example.org")
#: datatrove's defaults (addresses that did not answer ping when its list was made)
IPV4_REPLACEMENTS = ("22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206",
                     "220.127.116.11", "18.104.22.168")
#: the IPv6 documentation prefix (RFC 3849): never a real host
IPV6_REPLACEMENTS = ("2001:db8::1", "2001:db8:85a3::8a2e:370:7334")
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def _ipv4_valid(span: str, only_public: bool) -> bool:
    try:
        return not only_public or ipaddress.ip_address(span).is_global
    except ValueError:
        return False


def _ipv6_valid(span: str, only_public: bool) -> bool:
    try:
        ip = ipaddress.IPv6Address(span)
    except ValueError:
        return False
    return not only_public or (ip.is_global and ip in _GLOBAL_UNICAST)


@dataclass(frozen=True)
class Edit:
    """One replaced span: ``[start, end)`` character offsets in the original text."""

    cls: str
    start: int
    end: int
    original: str
    replacement: str


def _replace(text: str, pattern: re.Pattern, cls: str, replacements: Sequence[str],
             valid) -> tuple[str, list[Edit]]:
    """``pattern`` matches replaced in turn; edits with offsets in ``text``."""
    out: list[str] = []
    edits: list[Edit] = []
    pos = 0
    for m in pattern.finditer(text):
        span = m.group(0)
        if valid is not None and not valid(span):
            continue  # datatrove: an invalid match is replaced by itself (and consumed)
        rep = replacements[len(edits) % len(replacements)]
        out += [text[pos:m.start()], rep]
        edits.append(Edit(cls, m.start(), m.end(), span, rep))
        pos = m.end()
    if not edits:
        return text, edits
    out.append(text[pos:])
    return "".join(out), edits


def _to_original(edits: list[Edit], earlier: list[Edit]) -> list[Edit]:
    """``edits`` (offsets in the text after ``earlier``) with offsets in the text before."""
    if not earlier:
        return edits
    out, shift, i = [], 0, 0
    for e in edits:
        # earlier edits that end before e (in edited coordinates) shift its offsets
        while i < len(earlier) and earlier[i].start + shift + len(earlier[i].replacement) \
                <= e.start:
            shift += len(earlier[i].replacement) - (earlier[i].end - earlier[i].start)
            i += 1
        out.append(Edit(e.cls, e.start - shift, e.end - shift, e.original, e.replacement))
    return out


def redact(text: str, stage: PIIRedact) -> tuple[str, list[Edit]]:
    """``text`` with the PII classes of ``stage`` replaced, and the edits made (offsets in
    ``text``, in order of class then position)."""
    passes = []
    if stage.emails:
        passes.append((EMAIL_RE, "email", stage.email_replacements, None,
                       lambda t: "@" in t))
    if stage.ipv4:
        passes.append((IPV4_RE, "ipv4", stage.ipv4_replacements,
                       lambda s: _ipv4_valid(s, stage.only_public),
                       lambda t: _IPV4_CANDIDATE.search(t) is not None))
    if stage.ipv6:
        passes.append((IPV6_RE, "ipv6", stage.ipv6_replacements,
                       lambda s: _ipv6_valid(s, stage.only_public),
                       lambda t: t.count(":") >= 2))
    done: list[Edit] = []
    for pattern, cls, reps, valid, candidate in passes:
        if not candidate(text):  # checked on the text this pass sees
            continue
        text, edits = _replace(text, pattern, cls, reps, valid)
        if edits:
            done = sorted([*done, *_to_original(edits, sorted(done, key=lambda e: e.start))],
                          key=lambda e: e.start)
    return text, sorted(done, key=lambda e: (e.cls != "email", e.cls, e.start))


class PIIRedact(DocumentStage):
    """Replace emails, IPv4 and IPv6 addresses by placeholders (see the module docstring).

    Keeps every document. Counts replacements per class in ``extra`` (the manifest's
    ``pii_replacements``) and sends one edit record per span to the quarantine sink.

    Args:
        emails, ipv4, ipv6: which classes are replaced.
        only_public: replace only global addresses (datatrove's ``only_remove_public_ips``).
        email_replacements, ipv4_replacements, ipv6_replacements: placeholders, used in
            turn within each document.

    Raises:
        ValueError: an empty replacement list, or a placeholder that a later pass would
            match again (its offsets could not be told).
    """

    name = "pii"
    version = 1

    def __init__(self, emails: bool = True, ipv4: bool = True, ipv6: bool = True,
                 only_public: bool = True,
                 email_replacements: Sequence[str] = EMAIL_REPLACEMENTS,
                 ipv4_replacements: Sequence[str] = IPV4_REPLACEMENTS,
                 ipv6_replacements: Sequence[str] = IPV6_REPLACEMENTS) -> None:
        super().__init__(emails=emails, ipv4=ipv4, ipv6=ipv6, only_public=only_public,
                         email_replacements=list(email_replacements),
                         ipv4_replacements=list(ipv4_replacements),
                         ipv6_replacements=list(ipv6_replacements))
        self.emails, self.ipv4, self.ipv6, self.only_public = emails, ipv4, ipv6, only_public
        self.email_replacements = tuple(email_replacements)
        self.ipv4_replacements = tuple(ipv4_replacements)
        self.ipv6_replacements = tuple(ipv6_replacements)
        for cls, reps in (("email", self.email_replacements), ("ipv4", self.ipv4_replacements),
                          ("ipv6", self.ipv6_replacements)):
            if not reps:
                raise ValueError(f"pii: {cls}_replacements is empty")
        for rep in self.email_replacements:
            if IPV4_RE.search(rep) or IPV6_RE.search(rep):
                raise ValueError(f"pii: email replacement {rep!r} holds an IP address")
        for rep in self.ipv4_replacements:
            if IPV6_RE.search(rep):
                raise ValueError(f"pii: ipv4 replacement {rep!r} looks like an IPv6 address")

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        for doc in docs:
            text, edits = redact(doc.text, self)
            for e in edits:
                self.extra[e.cls] += 1
                if self.sink is not None:
                    self.sink(Rejection(
                        key=doc.key, source=doc.source, stage=self.name,
                        reason=f"{self.name}:edit:{e.cls}", text=e.original,
                        detail=json.dumps({"start": e.start, "end": e.end,
                                           "replacement": e.replacement})))
            doc.text = text
            yield doc
