"""The trainer's data, opened once: :func:`open_data` and :class:`TrainData`.

:func:`open_data` resolves the run's ``data:`` (a training-mix manifest, or a curation
manifest or its folder), reads it and checks its shards through the one verified path
(:func:`tokenmill.manifests.verify.open_shards`: presence, headers and, unless ``verify:
false``, every shard's and sidecar's sha256), once per run. A curation manifest is planned
into an in-memory training-mix manifest (:func:`tokenmill.manifests.mix.plan_curation`: all its
sources at their mixture weights, one pass). Everything that reads the data afterwards
(the trainer, the LEM and n-gram side inputs, validation) asks the :class:`TrainData` it is
handed, which builds every :class:`~tokenmill.train.data.MixLoader` of the run in one place
(:meth:`TrainData.loader`) and never reads or hashes the manifest again.

The loader yields document-aligned rows (each starts at a document's EOT token and packs
whole documents), one pass in a seeded order, no replacement. A step's global batch is
``rows * world`` rows; rank ``r`` gets rows ``[r * rows, (r + 1) * rows)``, so the union
over ranks is the single-process stream with the same global batch. The *global stream*
is that stream's rows of ``seq_len + 1`` tokens back to back (the stream ``tokenmill ngram
lem`` and ``ngram features`` are aligned with).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from tokenmill.manifests.mix import plan_curation
from tokenmill.manifests.mixschema import TrainingMixManifest, mix_identity_sha256
from tokenmill.manifests.schedule import MixDocuments, documents_of
from tokenmill.manifests.verify import open_shards
from tokenmill.tokenizers import TokenizerIdentity
from tokenmill.train.config import TrainConfig
from tokenmill.train.data import MixLoader

Kind = Literal["curation", "training-mix"]


@dataclass(frozen=True)
class TrainData:
    """A run's data after :func:`open_data`: the manifest read and its shards checked.

    Attributes:
        name: ``data:`` as the config gives it (for messages).
        manifest_path: the manifest file (``manifest.json`` inside a curation folder).
        kind: ``"training-mix"`` or ``"curation"``.
        mix: the training-mix manifest read (as built, or planned over the curation
            manifest); ``root`` is the folder its shard paths are relative to.
        tokenizer: the tokenizer identity the manifest records.
        seq_len: T, tokens per row of inputs (rows hold ``T + 1``).
        rows: rows per rank per micro-step (the config's ``batch_size``).
        rank, world: this process's share of every step.
        documents: each split's documents (:class:`~tokenmill.manifests.schedule.MixDocuments`,
            by ``"train"`` / ``"val"``), listed once when the data was opened: every loader
            of the run is a view of them.
    """

    name: str
    manifest_path: Path
    kind: Kind
    mix: TrainingMixManifest
    root: Path
    tokenizer: TokenizerIdentity
    seq_len: int
    rows: int
    rank: int = 0
    world: int = 1
    documents: Mapping[str, MixDocuments] = field(default_factory=dict, repr=False,
                                                  compare=False)

    @property
    def global_rows(self) -> int:
        """Rows of one global step: ``rows * world``."""
        return self.rows * self.world

    @property
    def row_tokens(self) -> int:
        """Tokens of one row of the global stream: ``seq_len + 1``."""
        return self.seq_len + 1

    @cached_property
    def mix_sha256(self) -> str:
        """The training-mix manifest's identity (its sha256 without the side-channel
        listing, :func:`~tokenmill.manifests.mixschema.mix_identity_sha256`): what a side
        channel binds to. Raises ``ValueError`` for curation data (see
        :meth:`require_mix`)."""
        self.require_mix("a side channel", ValueError)
        return mix_identity_sha256(self.manifest_path)

    def require_mix(self, what: str, err: type[ValueError]) -> None:
        """Refuse curation data where ``what`` needs a training-mix manifest.

        Raises:
            err: one line naming ``what`` and the manifest.
        """
        if self.kind != "training-mix":
            raise err(f"{what} needs data: to be a training-mix manifest (`tokenmill mix "
                      f"build`), {self.manifest_path} is a curation manifest")

    def loader(self, split: Literal["train", "val"] = "train", *, rank: int | None = None,
               world: int | None = None, rows: int | None = None) -> MixLoader:
        """A :class:`MixLoader` over the data yielding ``int64 [rows, seq_len]`` torch
        inputs/targets of each global step for ``rank`` of ``world`` (defaults: this
        process's), over the documents listed when the data was opened (nothing is read
        again)."""
        rank = self.rank if rank is None else rank
        world = self.world if world is None else world
        rows = self.rows if rows is None else rows
        return MixLoader.from_documents(self.mix, self.root, self.documents[split],
                                        self.seq_len, rows * world, world_size=world,
                                        rank=rank, split=split, output="torch")

    def global_batches(self) -> Iterator[np.ndarray]:
        """The global stream step by step: ``int64 [global_rows, seq_len + 1]`` whole rows
        of every step in training order (all ranks' rows), until the data ends."""
        for d in self.loader(rank=0, world=1, rows=self.global_rows):
            yield torch.cat([d["inputs"], d["targets"][:, -1:]], dim=1).numpy()

    def stream_prefix(self, n_tokens: int) -> np.ndarray:
        """The first ``n_tokens`` (at most) of the global stream, ``int32 [n]``."""
        parts, n = [], 0
        batches = self.global_batches() if n_tokens > 0 else iter(())
        for rows in batches:
            parts.append(rows.astype(np.int32).reshape(-1))
            n += rows.size
            if n >= n_tokens:
                break
        return np.concatenate(parts)[:n_tokens] if parts else np.zeros(0, np.int32)

    def validation_rows(self, val_tokens: int) -> torch.Tensor:
        """The fixed validation rows ``int64 [Nv, seq_len + 1]``: the first ``Nv = max(1,
        val_tokens // seq_len)`` document-aligned rows of the val split (all sources' val
        shards in manifest order, one pass), the same at every evaluation.

        Raises:
            ValueError: the val split holds no row of ``seq_len + 1`` tokens.
        """
        n = max(1, val_tokens // self.seq_len)
        rows = []
        for d in self.loader("val", rank=0, world=1, rows=1):
            rows.append(torch.cat([d["inputs"][0], d["targets"][0, -1:]]))
            if len(rows) == n:
                break
        if not rows:
            raise ValueError(f"{self.name}: the val split has no row of {self.row_tokens} "
                             "tokens")
        return torch.stack(rows).to(torch.int64)

    def train_loader(self, steps: int) -> MixLoader:
        """This process's train loader (:meth:`loader`) for a run of ``steps`` loader steps
        (optimizer steps times gradient accumulation).

        Raises:
            ValueError: one pass over the data gives fewer steps (no replacement); names the
                data, its budget and the steps asked for.
        """
        loader = self.loader()
        if steps > loader.num_steps:
            raise ValueError(
                f"{self.name}: the data budget gives {loader.num_steps} steps of "
                f"{self.global_rows} x {self.row_tokens} tokens (one pass, no replacement); "
                f"the config asks {steps}: lower steps, or build a mix that grants more "
                "epochs")
        return loader


def open_data(cfg: TrainConfig, rank: int = 0, world: int = 1,
              verify: bool | None = None) -> TrainData:
    """Open the run's ``cfg.data`` (a training-mix manifest, or a curation manifest or its
    folder) once for ``rank`` of ``world``: read the manifest and check all its shards
    (both splits; sha256 unless ``verify`` (default ``cfg.verify``) is false). A curation
    manifest is planned with ``cfg.seed`` into a one-pass mix of all its sources. Each
    split's documents are listed once (:func:`~tokenmill.manifests.schedule.documents_of`),
    for every loader of the run.

    Raises:
        ShardVerifyError: no manifest there, not a JSON manifest, an invalid one, or a
            shard or sidecar missing, truncated or (``verify``) different (one line naming
            the file).
        ValueError: curation data without a source to read; a
            sidecar or range that disagrees with the manifest, a split without documents
            (see :func:`~tokenmill.manifests.schedule.load_documents`).
    """
    opened = open_shards(cfg.data, None, kind=None,
                         verify=cfg.verify if verify is None else verify)
    kind: Kind = "curation"
    if isinstance(opened.manifest, TrainingMixManifest):
        kind, mix, root = "training-mix", opened.manifest, opened.root
    else:
        mix, root = plan_curation(opened, seed=cfg.seed, epochs=1.0)
    documents = {split: documents_of(mix, root, split) for split in ("train", "val")}
    return TrainData(name=cfg.data, manifest_path=opened.manifest_path, kind=kind, mix=mix,
                     root=root, tokenizer=mix.tokenizer, seq_len=cfg.seq_len,
                     rows=cfg.batch_size, rank=rank, world=world, documents=documents)


def doc_ids(cu_seqlens: torch.Tensor | np.ndarray, b: int, t: int) -> torch.Tensor:
    """Document index per position ``int32 [b, t]`` from the loader's cumulative segment
    lengths over the flattened rows (``int32 [n_segments + 1]``), for document-masked
    attention (segments never cross rows)."""
    seg = np.zeros(b * t, dtype=np.int32)
    seg[np.asarray(cu_seqlens, dtype=np.int64)[1:-1]] = 1
    return torch.from_numpy(np.cumsum(seg, dtype=np.int32).reshape(b, t))
