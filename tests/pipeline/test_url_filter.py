"""The URL filter against datatrove's URLFilter with the lists datatrove ships."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.shared import corpora
from tokenmill.pipeline.document.url_filter import URLFilter, url_reason
from tokenmill.pipeline.stage import Document, Rejection


def _shared_urls() -> list[str]:
    urls = []
    for p in sorted(corpora("c4-en-sample", "data").glob("*.json.gz")):
        urls += [json.loads(line)["url"] for line in gzip.open(p, "rt")]
    for p in sorted(corpora("cc-main-2019-sample", "data").glob("*.jsonl.gz")):
        urls += [json.loads(line)["metadata"]["url"] for line in gzip.open(p, "rt")]
    return urls


def _planted(domains: list[str], blocked_urls: list[str]) -> list[str]:
    d = domains[:5]
    return [
        *(f"http://{x}/page" for x in d), *(f"https://www.{x}/a?b=1" for x in d),
        *(f"{x}" for x in d), *blocked_urls[:5],
        *(f"http://{x}x.com/" for x in d), *(f"http://not{x}/" for x in d),  # near misses
        *(u + "/more" for u in blocked_urls[:3]), *(u.upper() for u in blocked_urls[:3]),
        "http://example.com/porn/index.html", "http://example.com/Porn/index.html",
        "http://example.com/pornography", "http://example.com/ass-babes",
        "http://example.com/ass", "http://example.com/2girls1cup.html",
        "http://example.com/two-girls-1-cup", "http://example.com/classic",
        "http://192.168.0.1/x", "http://localhost:8080/x", "mailto:x@y.z",
        "http://sub.domain.co.uk/path", "http://xn--n3h.com/",
    ]


@pytest.mark.slow
def test_agrees_with_datatrove_on_every_shared_url(tmp_path, monkeypatch):
    url_filter = pytest.importorskip("datatrove.pipeline.filters.url_filter")
    pytest.importorskip("tldextract")
    from datatrove.data import Document as DTDocument
    from datatrove.utils._import_utils import ASSETS_PATH

    from tokenmill.pipeline.document.url_filter import _extractor

    monkeypatch.setattr(url_filter, "cached_assets_path", lambda **kw: str(tmp_path))
    theirs = url_filter.URLFilter()
    theirs.tldextractor = _extractor()  # the bundled public-suffix snapshot, as ours
    theirs.download_data()
    assets = Path(ASSETS_PATH)
    ours = URLFilter(archive=str(assets / "url_filterblacklistsv0_3_0.tar.gz"),
                     banned_words=[str(assets / "banned_words.txt")],
                     banned_subwords=[str(assets / "banned_subwords.txt")],
                     soft_banned_words=[str(assets / "soft_banned_words.txt")])
    lists = ours.lists
    assert lists.domains == theirs.block_listed_domains
    assert lists.banned_words == theirs.banned_words
    urls = _shared_urls()
    assert len(urls) > 1500
    urls += _planted(sorted(theirs.block_listed_domains)[:5000:1000],
                     sorted(theirs.block_listed_url)[:500:100])
    reasons = set()
    for i, url in enumerate(urls):
        got = theirs.filter(DTDocument(text="", id=str(i), metadata={"url": url}))
        expected = None if got is True else got[1]
        assert url_reason(url, lists, 2) == expected, url
        reasons.add(expected)
    assert reasons >= {None, "domain", "subdomain", "url", "hard_blacklisted",
                       "soft_blacklisted", "blacklisted_subword"}


def _ut1_archive(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, body in [("blacklists/adult/domains", "# adult\nbad.com\n"),
                           ("blacklists/adult/urls", "good.org/bad/page\n"),
                           ("blacklists/gambling/domains", "casino.net\n"),
                           ("blacklists/README", "not a list\n")]:
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_ut1_archive_categories_and_reasons(tmp_path):
    archive = _ut1_archive(tmp_path / "ut1.tar.gz")
    words = tmp_path / "words.txt"
    words.write_text("# comment\nXXX\n")
    stage = URLFilter(archive=str(archive), banned_words=[str(words)], categories=["adult"])
    sink: list[Rejection] = []
    stage.sink = sink.append
    docs = [Document(f"s/f#{i}", "s", "t", {"url": u}) for i, u in enumerate(
        ["http://bad.com/x", "http://www.bad.com/", "good.org/bad/page", "http://casino.net/",
         "http://a.org/xxx-pics", "http://a.org/XXX-pics", "http://a.org/"])]
    docs.append(Document("s/f#9", "s", "no url"))
    kept = [d.key for d in stage(docs)]
    # casino.net: another category; words are matched with their case, as datatrove does
    assert kept == ["s/f#3", "s/f#5", "s/f#6", "s/f#9"]
    assert [r.reason for r in sink] == ["url_filter:domain", "url_filter:domain", "url_filter:url",
                                        "url_filter:hard_blacklisted"]
    assert sink[0].detail == "http://bad.com/x" and sink[0].text == "t"
    other = URLFilter(archive=str(archive), banned_words=[str(words)])
    assert other.fingerprint() != stage.fingerprint()
