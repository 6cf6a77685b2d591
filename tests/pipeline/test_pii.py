"""The PII stage against datatrove's PIIFormatter (emails, IPv4) and on its own (IPv6)."""

from __future__ import annotations

import json

import pytest

from tests.shared import corpora
from tokenmill.pipeline.document.pii import PIIRedact, redact
from tokenmill.pipeline.read.readers import is_data_file, read_file
from tokenmill.pipeline.stage import Document, Rejection


def _corpus_texts() -> list[str]:
    texts = []
    for folder in sorted(corpora().iterdir()):
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and rel != "README.md" and is_data_file(rel):
                texts += [d.text for d in read_file(folder, rel, folder.name)
                          if isinstance(d, Document)]
    return texts


@pytest.mark.slow
def test_emails_and_ipv4_as_datatrove_on_every_shared_document():
    pii = pytest.importorskip("datatrove.pipeline.formatters.pii")
    ours = PIIRedact(ipv6=False)
    texts = _corpus_texts()
    assert len(texts) > 5000
    changed = 0
    for text in texts:
        expected = pii.PIIFormatter().format(text)  # fresh: its turn counter restarts
        got, edits = redact(text, ours)
        assert got == expected
        changed += bool(edits)
    assert changed > 10  # the corpora hold real emails and public IPs


def test_edit_records_restore_the_original_text():
    text = ("write to a.b@c.org or x@[8.8.8.8], host 8.8.4.4 and 10.0.0.1, "
            "then bob@example.net; v6 2606:4700:4700::1111 and fe80::1")
    stage = PIIRedact()
    sink: list[Rejection] = []
    stage.sink = sink.append
    [doc] = stage([Document("s/f#0", "s", text)])
    assert "a.b@c.org" not in doc.text and "8.8.4.4" not in doc.text
    assert "10.0.0.1" in doc.text and "fe80::1" in doc.text  # not public: kept
    assert stage.extra == {"email": 3, "ipv4": 1, "ipv6": 1}
    for r in sink:
        d = json.loads(r.detail)
        assert r.reason.startswith("pii:edit:") and text[d["start"]:d["end"]] == r.text
    # the replacements are used in turn, restarting in each document
    assert doc.text.count("email@example.com") == 2
    assert doc.text.count("firstname.lastname@example.org") == 1
    assert stage.stats.docs_out == 1 and not stage.stats.rejected


def test_replacement_turn_does_not_depend_on_earlier_documents():
    stage = PIIRedact()
    one = [d.text for d in stage([Document("s/f#1", "s", "x@y.com")])]
    two = [d.text for d in stage([Document("s/f#0", "s", "p@q.com"),
                                  Document("s/f#1", "s", "x@y.com")])]
    assert one[0] == two[1] == "email@example.com"


@pytest.mark.parametrize("text,replaced", [
    ("2001:4860:4860::8888", True),
    ("[2606:4700:4700:0:0:0:0:1111]:443", True),
    ("2a00:1450:4001:82a::200e", True),
    ("::1", False), ("fe80::1ff:fe23:4567:890a", False), ("fd00::1", False),
    ("2001:db8::1", False),            # documentation prefix
    ("std::vector", False), ("a::b", False), ("dead:beef::1", False),  # not 2000::/3
    ("12:30:45", False), ("2001:4860:4860::8888::1", False),
])
def test_ipv6(text, replaced):
    got, edits = redact(f"at {text} now", PIIRedact())
    assert bool(edits) == replaced
    if replaced:
        assert edits[0].cls == "ipv6" and edits[0].replacement in got


def test_bad_replacements_are_config_errors():
    with pytest.raises(ValueError, match="empty"):
        PIIRedact(email_replacements=[])
    with pytest.raises(ValueError, match="IP address"):
        PIIRedact(email_replacements=["8.8.8.8"])


def test_offsets_after_an_earlier_pass_point_into_the_original():
    text = "aaaa@bbbbbbbbbbbbbbbbbbbbbbbb.com 1.1.1.1 c@d.io 9.9.9.9"
    got, edits = redact(text, PIIRedact())
    for e in edits:
        assert text[e.start:e.end] == e.original
