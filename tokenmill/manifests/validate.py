"""Validating and reading a curation manifest and its shards.

``validate_manifest`` re-checks every shard listed through the verified path
(:mod:`tokenmill.manifests.verify`): the file and its sidecar exist, its header is a
modded-nanogpt header whose token count matches the manifest and the file size, the
version matches the tokenizer's vocabulary, and the sha256 of the shard and of its
sidecar match. Unlike :func:`~tokenmill.manifests.verify.open_shards` it reports every
problem, each naming the file, instead of stopping at the first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import MANIFEST_NAME, load_manifest
from tokenmill.manifests.shards import (
    MAGIC,
    VERSION_UINT16,
    ShardHeader,
    read_header,
    read_sidecar,
    read_tokens,
    sidecar_path,
    version_for_vocab,
)
from tokenmill.manifests.verify import listed_shards, read_manifest, shard_problems


def validate_manifest(path: str | Path, log: Callable[[str], None] | None = None) -> list[str]:
    """Check every shard of the curation manifest at ``path`` (file or folder).

    Returns a list of problems (empty when valid); each names the file and what is wrong.

    Raises:
        ShardVerifyError: the manifest itself is missing, not JSON, of the other kind or
            invalid (one line).
    """
    mpath, m = read_manifest(path, "curation")
    root = mpath.resolve().parent
    shards = listed_shards(m, root)
    problems = shard_problems(shards, verify=True, what=str(mpath))
    want_version = version_for_vocab(m.tokenizer.n_vocab)
    for s in shards:
        if s.path.is_file() and s.entry.version != want_version:
            problems.append(f"{s.path}: version {s.entry.version}, tokenizer "
                            f"{m.tokenizer.name} needs {want_version}")
        if log:
            log(f"checked {s.entry.path}")
    listed = {s.path for s in shards}
    for p in sorted((root / "shards").rglob("*.bin")):
        if p.resolve() not in listed:
            problems.append(f"{p}: shard file not in the manifest (a loader globbing the "
                            "folder would read it)")
    for q in m.quarantine:
        p = root / q.path
        if not p.exists():
            problems.append(f"{p}: missing quarantine file")
        elif sha256_file(p) != q.sha256:
            problems.append(f"{p}: quarantine sha256 does not match the manifest")
    return problems


def describe_manifest(path: str | Path) -> str:
    """The per-source summary table of a manifest."""
    from tokenmill.manifests.summary import summary_table

    m = load_manifest(path)
    head = (f"datamix {m.name}  tokenizer {m.tokenizer.short()}  config {m.config_sha256[:12]}  "
            f"schema v{m.schema_version}")
    return head + "\n\n" + summary_table(m)


def _listing_manifest(shard: Path) -> tuple[str, str, dict | None] | None:
    """(tokenizer name, where from, its recorded identity) beside ``shard``: the nearest
    enclosing curation ``manifest.json`` that lists it, else an ``export.json`` in its
    folder (a modded-nanogpt export); ``None`` when there is neither."""
    target = shard.resolve()
    for parent in target.parents:
        mpath = parent / MANIFEST_NAME
        if mpath.is_file():
            try:
                m = load_manifest(mpath)
            except (ValueError, OSError):
                continue
            if any((parent / s.path).resolve() == target for s in m.shards()):
                return (m.tokenizer.name, f"the curation manifest {mpath}",
                        m.tokenizer.model_dump())
    export = target.parent / "export.json"
    if export.is_file():
        try:
            ident = json.loads(export.read_text(encoding="utf-8"))["tokenizer"]
            name = ident["name"]
        except (ValueError, KeyError, TypeError, OSError):
            return None
        full = ident if isinstance(ident, dict) and "ranks_sha256" in ident else None
        return str(name), f"the export's {export}", full


def implied_encoding(h: ShardHeader, tokens: np.ndarray) -> tuple[str, str]:
    """The tiktoken encoding a shard's header implies, and why.

    Version 1 (uint16 tokens) is modded-nanogpt's FineWeb format, whose tokenizer is GPT-2.
    Version 2 (uint32) is tokenmill's format for vocabularies over 65,536 ids, which among
    the supported encodings are ``cl100k_base`` and ``o200k_base``: the first token (every
    tokenmill document starts with EOT) picks the one whose EOT it is; failing that, the
    largest id picks the smallest vocabulary that holds it.

    Returns:
        (encoding name, one-line reason).
    """
    from tokenmill.tokenizers import get_encoding

    if h.version == VERSION_UINT16:
        return "gpt2", ("header version 1 = uint16 tokens, modded-nanogpt's FineWeb format, "
                        "whose tokenizer is GPT-2")
    why = ("header version 2 = uint32 tokens, tokenmill's format for vocabularies over "
           "65,536 ids (cl100k_base or o200k_base)")
    first = int(tokens[0]) if tokens.size else -1
    for name in ("cl100k_base", "o200k_base"):
        if first == get_encoding(name).eot_token:
            return name, f"{why}; the first token {first:,} is {name}'s EOT"
    top = int(tokens.max()) if tokens.size else 0
    name = "cl100k_base" if top < get_encoding("cl100k_base").n_vocab else "o200k_base"
    return name, (f"{why}; the first token is no known EOT, the largest id {top:,} fits "
                  f"{name} (a guess)")


def tokenizer_warnings(h: ShardHeader, tokens: np.ndarray, enc, name: str,
                       doc_starts: np.ndarray | None) -> list[str]:
    """Why encoding ``enc`` (called ``name``) cannot have made the shard: ids out of its
    range, no EOT token at all, a header version other than the one its vocabulary is
    written with, or documents (``doc_starts``: the sidecar's offsets) not starting with
    EOT. Empty when nothing speaks against it."""
    out = []
    if tokens.size and int(tokens.max()) >= enc.n_vocab:
        out.append(f"token ids up to {int(tokens.max()):,}, but {name} has {enc.n_vocab:,} "
                   f"ids (0 to {enc.n_vocab - 1:,}): this shard was not made with {name}")
    if tokens.size and not bool((tokens == enc.eot_token).any()):
        out.append(f"no EOT token ({name}'s is {enc.eot_token:,}) in the shard, but every "
                   "document of a tokenmill or modded-nanogpt shard starts with one: made "
                   "with another tokenizer?")
    want = version_for_vocab(enc.n_vocab)
    if h.version != want:
        out.append(f"header version {h.version} ({np.dtype(h.dtype).name}), but {name} "
                   f"({enc.n_vocab:,} ids) is written as version {want}")
    if doc_starts is not None and doc_starts.size and tokens.size:
        bad = int((tokens[doc_starts.astype(np.int64)] != enc.eot_token).sum())
        if bad:
            out.append(f"{bad:,} of {doc_starts.size:,} documents (sidecar offsets) do not "
                       f"start with {name}'s EOT {enc.eot_token:,}")
    return out


def _doc_spans(tokens: np.ndarray, side, eot: int, docs: int) -> list[tuple[str, int, int]]:
    """(label, start, length) of the first ``docs`` documents: from the sidecar, else split
    at the EOT tokens (else the first 1,000 tokens)."""
    if side is not None:
        offs = side.column("offset").to_numpy()[:docs]
        lens = side.column("n_tokens").to_numpy()[:docs]
        keys = side.column("key").to_pylist()[:docs]
        return [(str(k), int(o), int(n)) for k, o, n in zip(keys, offs, lens, strict=True)]
    starts = np.flatnonzero(tokens == eot)
    if starts.size == 0:
        return [("no EOT: the first tokens", 0, min(1000, int(tokens.size)))]
    bounds = np.append(starts, tokens.size)
    return [("split at EOT, no sidecar", int(a), int(b - a))
            for a, b in zip(bounds[:docs], bounds[1:docs + 1], strict=False)]


def _decoded(tokens: np.ndarray, spans: list[tuple[str, int, int]], enc) -> list[str]:
    """Each span decoded (leading EOT dropped; invalid UTF-8 shown as ``\\x..`` escapes, never
    as U+FFFD), cut at 300 characters."""
    out = []
    for i, (label, a, n) in enumerate(spans):
        seg = np.asarray(tokens[a:a + n])
        if seg.size and int(seg[0]) == enc.eot_token:
            seg = seg[1:]
        text = enc.decode_bytes(seg.tolist()).decode("utf-8", errors="backslashreplace")
        preview = text[:300].replace("\n", "\\n") + ("…" if len(text) > 300 else "")
        out.append(f"\n[{i}] {label}  ({n:,} tokens)\n{preview}")
    return out


def inspect_shard(path: str | Path, tokenizer: str | None = None, docs: int = 3) -> str:
    """Header, counts and the first ``docs`` documents of a shard, decoded.

    The tokenizer is ``tokenizer`` when given, else the one recorded by the curation
    manifest that lists the shard (or by a modded-nanogpt export's ``export.json``), else
    the one the header's version implies (:func:`implied_encoding`); the output says which
    and why. ``WARNING:`` lines say when that tokenizer cannot have made the shard
    (:func:`tokenizer_warnings`), and then nothing is decoded.

    Raises:
        ShardError: the file is not a shard (bad magic, version or length).
        ValueError: an unknown tokenizer name, or an unreadable sidecar.
        TokenizerMismatchError: the manifest (or export) listing the shard records
            another identity than the installed tokenizer of that name has.
    """
    from tokenmill.tokenizers import get_encoding, load_checked

    p = Path(path)
    h = read_header(p)
    tokens = read_tokens(p)
    lines = [f"shard      {p}",
             f"header     magic {MAGIC} (modded-nanogpt), version {h.version} = "
             f"{np.dtype(h.dtype).name} tokens, {h.n_tokens:,} tokens"]
    side = read_sidecar(p) if sidecar_path(p).exists() else None
    if side is not None:
        lines.append(f"documents  {side.num_rows:,} (sidecar columns "
                     f"{', '.join(side.column_names)})")
    else:
        lines.append(f"documents  no sidecar ({sidecar_path(p).name}): split at EOT tokens")
    recorded = _listing_manifest(p)
    warnings = []
    if tokenizer is not None:
        name, why = tokenizer, "given with --tokenizer"
        if recorded and recorded[0] != tokenizer:
            warnings.append(f"{recorded[1]} says {recorded[0]}, not {tokenizer}")
    else:
        name, why = recorded[:2] if recorded else implied_encoding(h, tokens)
        why = f"from {why}" if recorded else why
    if recorded and recorded[2] is not None and recorded[0] == name:
        enc = load_checked(recorded[2], recorded[1].removeprefix("the "))
    else:
        enc = get_encoding(name)
    lines.append(f"tokenizer  {name} ({why})")
    lines.append(f"EOT        {int((tokens == enc.eot_token).sum()):,} tokens (id "
                 f"{enc.eot_token:,})")
    starts = side.column("offset").to_numpy() if side is not None else None
    warnings += tokenizer_warnings(h, tokens, enc, name, starts)
    lines += [f"WARNING: {w}" for w in warnings]
    if tokens.size and int(tokens.max()) >= enc.n_vocab:
        lines.append(f"(not decoded: ids out of {name}'s range; try --tokenizer)")
    elif docs > 0:
        lines += _decoded(tokens, _doc_spans(tokens, side, enc.eot_token, docs), enc)
    return "\n".join(lines)
