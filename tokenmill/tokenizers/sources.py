"""Loading a tokenizer that is not built in: from its ``tokenizer:`` table, or from the
``source`` its identity records (a ranks file or tokenizer.json that may have moved)."""

from __future__ import annotations

import os

from tokenmill.tokenizers.bpe_file import BpeFileSpec, load_bpe_file
from tokenmill.tokenizers.hf_json import TokenizerJsonSpec, load_tokenizer_json
from tokenmill.tokenizers.identities import IDENTITY_VERSION, TokenizerIdentity, TokenizerSource
from tokenmill.tokenizers.tiktoken_parts import (
    EncodingParts,
    bpe_identity_sha256,
    ranks_text_sha256,
)

MOVED_FILES_ENV = "TOKENMILL_TOKENIZER_DIR"


def _absolute(src: str, base_dir: str | os.PathLike | None) -> str:
    if "://" in src:
        return src
    return os.path.abspath(os.path.join(os.fspath(base_dir or "."), os.path.expanduser(src)))


def _identity(parts: EncodingParts, eot: str, source: TokenizerSource) -> TokenizerIdentity:
    return TokenizerIdentity(
        version=IDENTITY_VERSION, name=parts.name,
        ranks_sha256=ranks_text_sha256(parts.mergeable_ranks),
        identity_sha256=bpe_identity_sha256(parts), n_vocab=parts.encoding().n_vocab,
        eot_token=parts.special_tokens[eot], source=source)


def load_spec(spec, base_dir: str | os.PathLike | None
              ) -> tuple[TokenizerIdentity, EncodingParts]:
    """(identity, parts) of a ``tokenizer:`` table (a dict, a :class:`BpeFileSpec` or a
    :class:`TokenizerJsonSpec`); relative paths are taken from ``base_dir``.

    Raises:
        ValueError: one line: the table is neither form, or as the loaders raise.
    """
    if isinstance(spec, dict):
        try:
            spec = (TokenizerJsonSpec.model_validate(spec) if "tokenizer_json" in spec
                    else BpeFileSpec.model_validate(spec))
        except ValueError as e:
            first = str(e).splitlines()
            raise ValueError(f"tokenizer table {spec!r} is invalid: "
                             f"{' '.join(first[1:3]) if len(first) > 2 else e}") from None
    if isinstance(spec, TokenizerJsonSpec):
        path = _absolute(spec.tokenizer_json, base_dir)
        parts, eot = load_tokenizer_json(path, name=spec.name, eot=spec.eot)
        return _identity(parts, eot, TokenizerSource(
            tokenizer_json=spec.tokenizer_json, pattern=parts.pat_str,
            special_tokens=dict(parts.special_tokens), eot=eot)), parts
    if not isinstance(spec, BpeFileSpec):
        raise ValueError(f"tokenizer {spec!r}: expected a name or a table")
    path = _absolute(spec.ranks, base_dir)
    tok = load_bpe_file(spec.model_copy(update={"ranks": path}))
    return _identity(tok.parts, spec.eot, TokenizerSource(
        ranks=spec.ranks, pattern=spec.pattern, special_tokens=dict(spec.special_tokens),
        eot=spec.eot)), tok.parts


def _record_file(where: str) -> str | None:
    """The file a ``where`` label names: the label itself, or its longest tail after a
    space that exists (``"curation manifest out/manifest.json"`` -> ``out/manifest.json``)."""
    if os.path.exists(where):
        return where
    for i, ch in enumerate(where):
        if ch == " " and os.path.exists(where[i + 1:]):
            return where[i + 1:]
    return None


def _locate(path: str, ident: TokenizerIdentity, where: str) -> str:
    """Where the recorded file ``path`` is: a URL or an existing absolute path as it is; a
    relative path (as the datamix named it, relative to its folder) from the working
    folder or from the folders holding ``where`` (when it is a file) and their parents;
    else ``$TOKENMILL_TOKENIZER_DIR/<its file name>``."""
    if "://" in path or (os.path.isabs(path) and os.path.exists(path)):
        return path
    if not os.path.isabs(path):
        folders = ["."]
        record = _record_file(where)
        if record is not None:
            up = os.path.dirname(os.path.abspath(record))
            for _ in range(4):
                folders.append(up)
                up = os.path.dirname(up)
        for folder in folders:
            if os.path.exists(os.path.join(folder, path)):
                return os.path.join(folder, path)
    folder = os.environ.get(MOVED_FILES_ENV)
    if folder and os.path.exists(os.path.join(folder, os.path.basename(path))):
        return os.path.join(folder, os.path.basename(path))
    raise ValueError(
        f"{where} records tokenizer {ident.short()} from {path}, which is not found (from "
        f"here, or beside {where}); run from the datamix's folder, or set {MOVED_FILES_ENV} "
        f"to a folder holding {os.path.basename(path)} (its identity is checked after "
        "loading)")


def load_source(recorded: TokenizerIdentity, where: str
                ) -> tuple[TokenizerIdentity, EncodingParts]:
    """(identity, parts) loaded from the files ``recorded.source`` names, for the caller to
    compare with ``recorded`` (found by :func:`_locate`).

    Raises:
        ValueError: one line naming the file and ``where``.
    """
    src = recorded.source
    assert src is not None
    if src.tokenizer_json is not None:
        spec = TokenizerJsonSpec(tokenizer_json=_locate(src.tokenizer_json, recorded, where),
                                 name=recorded.name, eot=src.eot)
    else:
        spec = BpeFileSpec(name=recorded.name, ranks=_locate(src.ranks or "", recorded, where),
                           pattern=src.pattern, special_tokens=src.special_tokens, eot=src.eot)
    ident, parts = load_spec(spec, None)
    return ident.model_copy(update={"source": src}), parts
