"""Validating and reading a curation manifest and its shards.

``validate_manifest`` re-checks every shard listed: the file exists, its header is a
modded-nanogpt header whose token count matches the manifest and the file size, the
version matches the tokenizer's vocabulary, and the sha256 of the shard and of its
sidecar match. Each problem is reported naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import MANIFEST_NAME, load_manifest
from tokenmill.manifests.shards import (
    ShardError,
    read_header,
    read_sidecar,
    read_tokens,
    sidecar_path,
    version_for_vocab,
)


def _folder(path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_dir() else p.parent


def validate_manifest(path: str | Path, log: Callable[[str], None] | None = None) -> list[str]:
    """Check every shard of the manifest at ``path`` (file or folder).

    Returns a list of problems (empty when valid); each names the file and what is wrong.
    """
    m = load_manifest(path)
    root = _folder(path)
    problems: list[str] = []
    want_version = version_for_vocab(m.tokenizer.n_vocab)
    for src in m.sources:
        for s in src.shards:
            p = root / s.path
            if not p.exists():
                problems.append(f"{p}: missing")
                continue
            try:
                h = read_header(p)
            except ShardError as e:
                problems.append(str(e))
                continue
            if h.n_tokens != s.tokens:
                problems.append(f"{p}: header has {h.n_tokens} tokens, manifest {s.tokens}")
            if h.version != s.version or h.version != want_version:
                problems.append(f"{p}: version {h.version}, manifest {s.version}, tokenizer "
                                f"{m.tokenizer.name} needs {want_version}")
            digest = sha256_file(p)
            if digest != s.sha256:
                problems.append(f"{p}: sha256 {digest} != manifest {s.sha256}")
            sc = sidecar_path(p)
            if not sc.exists():
                problems.append(f"{sc}: missing sidecar")
            elif sha256_file(sc) != s.sidecar_sha256:
                problems.append(f"{sc}: sidecar sha256 does not match the manifest")
            if log:
                log(f"checked {s.path}")
    listed = {(root / s.path).resolve() for s in m.shards()}
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


def _find_manifest(shard: Path) -> Path | None:
    for parent in shard.resolve().parents:
        if (parent / MANIFEST_NAME).exists():
            return parent / MANIFEST_NAME
    return None


def inspect_shard(path: str | Path, tokenizer: str | None = None, docs: int = 3) -> str:
    """Header, counts and the first ``docs`` documents of a shard, decoded.

    The tokenizer is taken from the nearest enclosing manifest unless given.
    """
    from tokenmill.tokenizers import get_encoding

    p = Path(path)
    h = read_header(p)
    tokens = read_tokens(p)
    lines = [f"shard    {p}", f"magic    20240520  version {h.version} "
             f"({'uint16' if h.version == 1 else 'uint32'})  tokens {h.n_tokens}"]
    if tokenizer is None:
        mpath = _find_manifest(p)
        if mpath is not None:
            tokenizer = load_manifest(mpath).tokenizer.name
    side = read_sidecar(p) if sidecar_path(p).exists() else None
    if side is not None:
        lines.append(f"documents {side.num_rows}  sidecar columns {side.column_names}")
    if tokenizer is None or side is None:
        return "\n".join(lines)
    enc = get_encoding(tokenizer)
    eot = int((tokens == enc.eot_token).sum())
    lines.append(f"EOT tokens {eot}  tokenizer {tokenizer}")
    offs = side.column("offset").to_numpy()
    lens = side.column("n_tokens").to_numpy()
    keys = side.column("key").to_pylist()
    for i in range(min(docs, side.num_rows)):
        seg = tokens[int(offs[i]) : int(offs[i]) + int(lens[i])]
        text = enc.decode(seg[1:].tolist())
        preview = text[:300].replace("\n", "\\n")
        lines.append(f"\n[{i}] {keys[i]}  ({int(lens[i])} tokens)\n{preview}"
                     + ("…" if len(text) > 300 else ""))
    return "\n".join(lines)
