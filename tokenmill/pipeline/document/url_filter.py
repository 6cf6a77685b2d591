"""URL filter: documents whose URL is on a block list are removed.

API::

    from tokenmill.pipeline.document.url_filter import URLFilter, BlockLists
    stage = URLFilter(archive="blacklists.tar.gz", banned_words=["banned_words.txt"])
    kept = list(stage(docs))   # reads doc.metadata["url"] (the source's url_field)

The decision is datatrove's ``URLFilter`` (``datatrove.pipeline.filters.url_filter``, as
used for FineWeb, Penedo et al. 2024), in its order, each with its reason
(``url_filter:<reason>``):

1. ``domain``: the registered domain (public-suffix rules of ``tldextract``'s bundled
   snapshot, so nothing is downloaded) is a blocked domain;
2. ``subdomain``: the full host name is a blocked domain;
3. ``url``: the URL is a blocked URL (exactly);
4. ``hard_blacklisted``: a banned word is a word of the URL (split at runs of characters
   other than ASCII letters and digits, case kept);
5. ``soft_blacklisted``: ``soft_word_threshold`` or more soft-banned words are words of it;
6. ``blacklisted_subword``: a banned subword occurs in the URL lower-cased with every
   character other than ASCII letters and digits removed (Aho-Corasick, ``pyahocorasick``).

Block lists are files (one entry per line, lines starting with ``#`` skipped; words are
normalized as datatrove does: lower-cased, non-alphanumerics removed) or a UT1-format
archive (the Université Toulouse 1 Capitole blacklists: ``blacklists/<category>/domains``
and ``.../urls``; datatrove ships one with ``domains`` and ``urls`` at its top). A
document without a URL is kept and counted (``extra["no_url"]``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tokenmill import objectcache
from tokenmill.pipeline.stage import Document, DocumentStage

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")


def normalize_word(text: str) -> str:
    """``text`` lower-cased with every character other than ASCII letters and digits
    removed (datatrove's ``normalize``)."""
    return _NON_ALNUM.sub("", text).lower()


def _entries(lines: Iterable[str], words: bool) -> set[str]:
    return {normalize_word(x) if words else x.strip() for x in lines if x[0] != "#"}


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return list(f)


def _archive_lists(path: str, categories: Sequence[str] | None) -> dict[str, set[str]]:
    """``{"domains": ..., "urls": ...}`` of a UT1-format archive."""
    out: dict[str, set[str]] = {"domains": set(), "urls": set()}
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            p = PurePosixPath(member.name)
            if not member.isfile() or p.name not in out:
                continue
            if categories is not None and (len(p.parts) < 2 or p.parts[-2] not in categories):
                continue
            f = tar.extractfile(member)
            assert f is not None
            lines = f.read().decode("utf-8", "replace").splitlines(keepends=True)
            out[p.name] |= _entries(lines, words=False)
    return out


@dataclass
class BlockLists:
    """The lists a URL is matched against (see the module docstring)."""

    domains: set[str]
    urls: set[str]
    banned_words: set[str]
    banned_subwords: Any  # a built ahocorasick.Automaton, or None when there are none
    soft_banned_words: set[str]


@functools.lru_cache(maxsize=2)
def load_block_lists(archive: str | None, categories: tuple[str, ...] | None,
                     domains: tuple[str, ...], urls: tuple[str, ...],
                     banned_words: tuple[str, ...], banned_subwords: tuple[str, ...],
                     soft_banned_words: tuple[str, ...], digest: str) -> BlockLists:
    """The block lists of these files, read once per process (``digest``: of their
    content, so that a changed file is read again)."""
    import ahocorasick

    lists = _archive_lists(archive, categories) if archive else {"domains": set(), "urls": set()}
    for p in domains:
        lists["domains"] |= _entries(_read_lines(p), words=False)
    for p in urls:
        lists["urls"] |= _entries(_read_lines(p), words=False)

    def words(paths: tuple[str, ...]) -> set[str]:
        return set().union(*(_entries(_read_lines(p), words=True) for p in paths))

    sub = words(banned_subwords)
    automaton = None
    if sub:
        automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
        for w in sub:
            automaton.add_word(w, len(automaton))
        automaton.make_automaton()
    return BlockLists(lists["domains"], lists["urls"], words(banned_words), automaton,
                      words(soft_banned_words))


def files_digest(paths: Iterable[str]) -> str:
    """sha256 over the bytes of ``paths`` (in order), read in 1 MiB chunks.

    Raises:
        FileNotFoundError: a list file is missing.
    """
    h = hashlib.sha256()
    for p in paths:
        h.update(p.encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def cached_files_digest(paths: Sequence[str]) -> str:
    """:func:`files_digest` of ``paths``, computed once per process while the files' sizes
    and modification times stay the same.

    Raises:
        FileNotFoundError: a list file is missing.
    """
    stamp = tuple((p, *(lambda st: (st.st_size, st.st_mtime_ns))(Path(p).stat()))
                  for p in paths)
    return _digest_of(stamp)


@functools.lru_cache(maxsize=8)
def _digest_of(stamp: tuple) -> str:
    return files_digest([p for p, *_ in stamp])


@functools.lru_cache(maxsize=1)
def _extractor():
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def url_reason(url: str, lists: BlockLists, soft_word_threshold: int) -> str | None:
    """Why ``url`` is blocked (datatrove's reason names), or None."""
    info = _extractor()(url)
    registered = f"{info.domain}.{info.suffix}" if info.domain and info.suffix else ""
    if registered in lists.domains:
        return "domain"
    if info.fqdn in lists.domains:
        return "subdomain"
    if url in lists.urls:
        return "url"
    words = set(_NON_ALNUM.split(url))
    if not lists.banned_words.isdisjoint(words):
        return "hard_blacklisted"
    if len(lists.soft_banned_words & words) >= soft_word_threshold:
        return "soft_blacklisted"
    if lists.banned_subwords is not None and \
            next(lists.banned_subwords.iter(normalize_word(url)), False):
        return "blacklisted_subword"
    return None


class URLFilter(DocumentStage):
    """Remove documents whose ``metadata["url"]`` is blocked (see the module docstring).

    Args:
        archive: UT1-format archive path (or None); categories: its categories to use.
        domains, urls, banned_words, banned_subwords, soft_banned_words: list files.
        soft_word_threshold: soft-banned words that block a URL.
        digest: sha256 of the lists' content (part of the fingerprint; computed when None).

    Raises:
        FileNotFoundError: a list file is missing.
    """

    name = "url_filter"
    version = 1

    def __init__(self, archive: str | None = None, categories: Sequence[str] | None = None,
                 domains: Sequence[str] = (), urls: Sequence[str] = (),
                 banned_words: Sequence[str] = (), banned_subwords: Sequence[str] = (),
                 soft_banned_words: Sequence[str] = (), soft_word_threshold: int = 2,
                 digest: str | None = None) -> None:
        files = tuple(str(Path(p)) for p in ([archive] if archive else [])) + tuple(
            [*domains, *urls, *banned_words, *banned_subwords, *soft_banned_words])
        digest = digest or cached_files_digest(files)
        # the lists' content, not where they lie, is the config
        super().__init__(categories=sorted(categories) if categories else None,
                         soft_word_threshold=soft_word_threshold, digest=digest)
        self._args = (archive, tuple(categories) if categories else None, tuple(domains),
                      tuple(urls), tuple(banned_words), tuple(banned_subwords),
                      tuple(soft_banned_words), digest)
        self.soft_word_threshold = soft_word_threshold

    @property
    def lists(self) -> BlockLists:
        archive, categories, *groups, digest = self._args
        # a list given by URL (an output in an object store): this node's copy of it
        local = [tuple(objectcache.node_file(p) for p in g) for g in groups]
        return load_block_lists(archive and objectcache.node_file(archive), categories, *local,
                                digest)

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        lists = self.lists
        for doc in docs:
            url = doc.metadata.get("url")
            if not url:
                self.extra["no_url"] += 1
                yield doc
                continue
            why = url_reason(str(url), lists, self.soft_word_threshold)
            if why is None:
                yield doc
            else:
                self.reject(doc, f"{self.name}:{why}", detail=str(url))
