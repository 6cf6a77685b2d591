"""``tokenmill ngram lem MIX -o DIR``: the LEM side channel of a training mix, ahead of time.

The stream is the one :class:`tokenmill.train.data.MixLoader` yields for the mix, its seed
and the given ``--seq-len``, global ``--batch-size`` and ``--remainder``: its rows of
``seq_len + 1`` tokens, step after step, back to back (the schedule of
:mod:`tokenmill.manifests.schedule`, the same stream ``tokenmill shards export`` writes).
Row ``r`` of step ``s`` covers stream positions ``(s * B + r) * (T + 1) + [0, T + 1)``.

Output, aligned position for position with that stream, in shards of ``--shard-tokens``:

* ``lem_len_NNNNNN.npy``: match length, uint8 capped at 255 (uint16 capped at 65,535 with
  ``--len-dtype uint16``);
* ``lem_next_NNNNNN.npy``: ``[n, k]`` candidate next tokens, most recent occurrence first,
  uint16 with 65,535 for "none" when the vocabulary has at most 65,535 ids, else int32
  with -1;
* ``lem.json``: the settings, the mix manifest's path and identity
  (:func:`~tokenmill.manifests.mixschema.mix_identity_sha256`: its sha256 without the
  side-channel listing), and every file with its tokens and sha256 (all written
  atomically).

A re-run into the same folder leaves exactly its own files: shards of an earlier run that
this one did not write (it had more of them) are removed once ``lem.json`` is written
(:func:`remove_stale_shards`).

The side channel is then listed in the mix manifest (``side_channels``: kind
``lem-side-channel``, the split, ``lem.json`` and every ``.npy`` file by their paths
relative to the manifest's folder, with sha256), replacing an earlier listing of the same
kind and split (:func:`~tokenmill.manifests.mixschema.register_side_channel`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from pathlib import Path

import numpy as np

from tokenmill.atomic import atomic_write_bytes, atomic_write_text, sha256_bytes, sha256_file
from tokenmill.cliargs import add_output_argument
from tokenmill.manifests.mixschema import (
    SideChannelFile,
    SideChannelRef,
    mix_identity_sha256,
    register_side_channel,
)


def mix_stream(manifest: str | Path, *, split: str = "train", seq_len: int = 2048,
               batch_size: int = 1, remainder: str = "carry", verify: bool = True
               ) -> tuple[np.ndarray, object, Path]:
    """The MixLoader token stream of a training-mix manifest (module docstring).

    Returns:
        ``(tokens int32[steps * B * (T + 1)], manifest model, manifest file)``.

    Raises:
        ShardVerifyError / ValueError: as :func:`tokenmill.manifests.verify.open_shards`
            and :func:`tokenmill.manifests.schedule.load_documents` (naming the file).
    """
    from tokenmill.manifests.schedule import MixSchedule, load_documents
    from tokenmill.manifests.verify import open_shards

    if remainder not in ("carry", "drop"):
        raise ValueError(f"remainder must be 'carry' or 'drop', not {remainder!r}")
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be >= 1")
    opened = open_shards(manifest, split, kind="training-mix", verify=verify)
    m = opened.manifest
    eot = int(m.tokenizer.eot_token)
    docs = load_documents(m, opened.root, split, verify=False)  # verified above
    sched = MixSchedule(m, docs, split, seq_len, batch_size, carry_all=remainder == "carry")
    steps = sched.num_steps()
    if steps == 0:
        raise ValueError(f"{opened.manifest_path}: the {split} split has no whole step of "
                         f"{batch_size} x {seq_len + 1} tokens (make --seq-len or "
                         "--batch-size smaller)")
    out = np.empty(steps * batch_size * (seq_len + 1), np.int32)
    o = 0
    for step in range(steps):
        n = sched.plan(step)
        for i in range(n):
            if sched.piece_bos[i]:
                out[o] = eot
                o += 1
            ln = int(sched.piece_len[i])
            off = int(sched.piece_off[i])
            out[o:o + ln] = docs.shards[int(sched.piece_shard[i])][off:off + ln]
            o += ln
    if o != out.size:
        raise ValueError(f"{opened.manifest_path}: the schedule gave {o:,} tokens for "
                         f"{steps} steps of {batch_size} x {seq_len + 1}")
    return out, m, opened.manifest_path


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (else a usage error naming the value)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, not {text!r}")
    return v


def check_out_folder(out: str | Path) -> Path:
    """The ``-o`` folder, refused before any work when it names an existing file.

    Raises:
        ValueError: one line naming the path.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: -o must be a folder, this is a file")
    return out


def remove_stale_shards(out: Path, patterns: tuple[str, ...], files: list[dict],
                        keys: tuple[str, ...]) -> list[Path]:
    """Remove the files of ``out`` matching one of the glob ``patterns`` (a side channel's
    shard names, e.g. ``lem_len_*.npy``) that are not among this run's ``files`` (their
    ``keys`` entries): the extra shards an earlier run with more of them left behind.
    Called after the new metadata file is written (the new shards overwrite the old ones
    in place before it, so a crash in between leaves shards the old metadata's sha256
    refuses), so the listing and the folder agree once this returns.

    Returns:
        the files removed, sorted.
    """
    keep = {str(f[k]) for f in files for k in keys}
    stale = sorted({p for pat in patterns for p in out.glob(pat)
                    if p.is_file() and p.name not in keep})
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def write_lem_shards(out: Path, match_len: np.ndarray, next_tokens: np.ndarray, *,
                     n_vocab: int, shard_tokens: int, len_dtype: str = "uint8") -> list[dict]:
    """Write the side-channel shards (module docstring); returns their entries
    ``{"len", "next", "start", "tokens", "len_sha256", "next_sha256"}``."""
    cap = np.iinfo(len_dtype).max
    nd = np.uint16 if n_vocab <= 65535 else np.int32
    files = []
    for i, a in enumerate(range(0, max(1, match_len.size), shard_tokens)):
        ml = np.minimum(match_len[a:a + shard_tokens], cap).astype(len_dtype)
        nt = next_tokens[a:a + shard_tokens]
        nt = np.where(nt < 0, 65535, nt).astype(nd) if nd == np.uint16 else nt.astype(nd)
        lb, nb_ = _npy_bytes(ml), _npy_bytes(np.ascontiguousarray(nt))
        names = (f"lem_len_{i:06d}.npy", f"lem_next_{i:06d}.npy")
        atomic_write_bytes(out / names[0], lb)
        atomic_write_bytes(out / names[1], nb_)
        files.append({"len": names[0], "next": names[1], "start": a, "tokens": int(ml.size),
                      "len_sha256": sha256_bytes(lb), "next_sha256": sha256_bytes(nb_)})
    return files


def register_lem_side_channel(mix: Path, out: Path, split: str, files: list[dict]) -> None:
    """List ``out/lem.json`` and its shards (``files`` as :func:`write_lem_shards` returns
    them) in the mix manifest ``mix`` (module docstring), by paths relative to its folder.

    Raises:
        as :func:`tokenmill.manifests.mixschema.register_side_channel`.
    """
    base = Path(mix).resolve().parent

    def rel(name: str) -> str:
        return Path(os.path.relpath((out / name).resolve(), base)).as_posix()

    listed = [SideChannelFile(path=rel(f[key]), sha256=f[f"{key}_sha256"])
              for f in files for key in ("len", "next")]
    register_side_channel(mix, SideChannelRef(
        kind="lem-side-channel", split=split, path=rel("lem.json"),
        sha256=sha256_file(out / "lem.json"), files=listed))


def _lem(args: argparse.Namespace) -> int:
    from tokenmill.ngram.precompute import precompute_lem

    check_out_folder(args.out)
    t0 = time.perf_counter()
    tokens, m, mpath = mix_stream(args.mix, split=args.split, seq_len=args.seq_len,
                                  batch_size=args.batch_size, remainder=args.remainder,
                                  verify=not args.no_verify)
    if args.no_verify:
        print("shard verification is off (--no-verify)")
    t1 = time.perf_counter()
    ml, nt = precompute_lem(tokens, k=args.k, mode="position", window=args.window,
                            eot=int(m.tokenizer.eot_token), max_len=args.max_len,
                            workers=args.workers, ray_address=args.ray_address)
    t2 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = write_lem_shards(out, ml, nt, n_vocab=int(m.tokenizer.n_vocab),
                             shard_tokens=args.shard_tokens, len_dtype=args.len_dtype)
    meta = {"kind": "lem-side-channel", "mix": str(mpath),
            "mix_sha256": mix_identity_sha256(mpath),
            "split": args.split, "seq_len": args.seq_len, "batch_size": args.batch_size,
            "remainder": args.remainder, "mode": "position", "k": args.k,
            "window": args.window, "max_len": args.max_len,
            "eot": int(m.tokenizer.eot_token), "tokens": int(tokens.size),
            "stream_sha256": sha256_bytes(tokens.astype("<i4").tobytes()), "files": files}
    atomic_write_text(out / "lem.json", json.dumps(meta, indent=1) + "\n")
    remove_stale_shards(out, ("lem_len_*.npy", "lem_next_*.npy"), files, ("len", "next"))
    register_lem_side_channel(mpath, out, args.split, files)
    secs = t2 - t1
    print(f"LEM side channel -> {out}: {tokens.size:,} tokens, {len(files)} shards, "
          f"precompute {secs:.2f} s ({tokens.size / max(secs, 1e-9) / 1e6:.2f} M tokens/s, "
          f"{args.workers} workers), stream read {t1 - t0:.2f} s; "
          f"match > 0 at {(ml > 0).mean():.1%}; listed in {mpath}")
    return 0


def add_stream_arguments(p: argparse.ArgumentParser) -> None:
    """The options every side-channel command shares: the mix, ``-o`` and the MixLoader
    stream's split and geometry (:func:`mix_stream`)."""
    p.add_argument("mix", help="training-mix manifest (tokenmill mix build)")
    add_output_argument(p, required=True, dest="out", help="output folder",
                        aliases=("--out",))
    p.add_argument("--split", default="train", choices=["train", "val"])
    p.add_argument("--seq-len", type=positive_int, default=2048, help="MixLoader seq_len (T)")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="MixLoader global rows per step")
    p.add_argument("--remainder", default="carry", choices=["carry", "drop"])


def add_lem_command(nsub: argparse._SubParsersAction) -> None:
    """Register ``ngram lem`` on the ``ngram`` subparsers."""
    p = nsub.add_parser("lem", help="precompute the LEM side channel of a training mix")
    add_stream_arguments(p)
    p.add_argument("-k", type=int, default=4, help="candidate next tokens per position")
    p.add_argument("--window", type=int, default=4_000_000, help="visible history (0: all)")
    p.add_argument("--max-len", type=int, default=0, help="match length cap (0: none)")
    p.add_argument("--len-dtype", default="uint8", choices=["uint8", "uint16"])
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--workers", type=int, default=1, help="Ray workers (1: in-process)")
    p.add_argument("--ray-address", default=None)
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks")
    p.set_defaults(func=_lem)
