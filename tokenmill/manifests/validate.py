"""Validating and reading a curation manifest and its shards.

``validate_manifest`` re-checks every shard listed through the verified path
(:mod:`tokenmill.manifests.verify`): the file and its sidecar exist, its header is a
modded-nanogpt header whose token count matches the manifest and the file size, the
version matches the tokenizer's vocabulary, and the sha256 of the shard and of its
sidecar match. Unlike :func:`~tokenmill.manifests.verify.open_shards` it reports every
problem, each naming the file, instead of stopping at the first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import MANIFEST_NAME, load_manifest
from tokenmill.manifests.shards import (
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
