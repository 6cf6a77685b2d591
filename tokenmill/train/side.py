"""The trainer's side inputs: prefix auxiliary targets, legality mask rows, LEM features.

* prefix auxiliary target: the longest proper token prefix of each target
  (:class:`tokenmill.tokenizers.prefix.PrefixMap`), trained with a weighted second
  cross-entropy term (partial credit for a prefix of the right token);
* legality mask: packed rows of the tokenizer's possible (previous, next) pairs from a saved
  :class:`tokenmill.tokenizers.legality.LegalityTable` (polarity read from its header), used
  at evaluation only;
* LEM feature: the online longest-exact-match predictor's match length and candidate next
  tokens (:class:`tokenmill.ngram.lem.OnlineLEM`), computed in its own process ahead of the
  trainer (:class:`tokenmill.ngram.stream.LEMStream`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.ngram.lem import OnlineLEM
from tokenmill.ngram.stream import LEMStream
from tokenmill.tokenizers.legality import LegalityTable
from tokenmill.tokenizers.prefix import PrefixMap
from tokenmill.train.batches import open_loader
from tokenmill.train.config import TrainConfig


def prefix_array(encoding_name: str) -> np.ndarray:
    """``int32 [n_vocab]``: the longest proper token prefix of each token, -1 if none
    (:class:`tokenmill.tokenizers.prefix.PrefixMap`), used as the auxiliary target."""
    return np.asarray(PrefixMap.build(encoding_name).parent, dtype=np.int32)


def load_mask_bits(path: str, n_vocab: int, encoding_name: str | None = None) -> torch.Tensor:
    """Packed legality rows ``uint8 [n_vocab, ceil(n_vocab/8)]`` (LSB-first, 1 = possible) of
    a saved :class:`~tokenmill.tokenizers.legality.LegalityTable` file or folder.

    Every file goes through :meth:`LegalityTable.load`, which reads what a set bit means from
    the file's own header: tokenmill's tables (1 = possible) are used as they are, an export
    in modded-nanogpt's forbidden-pair polarity (``tokenmill legality export --format
    modded-nanogpt``) is inverted, and a file that does not state its polarity (a bare
    ``.npy`` mask) is refused, never guessed (issue 16).

    Raises:
        LegalityFormatError: not a table file, or a header without polarity (a ValueError).
        TokenizerMismatchError: the table is another tokenizer's (``encoding_name``).
        ValueError: the rows do not cover the vocabulary.
    """
    table = LegalityTable.load(Path(path), encoding=encoding_name)
    bits = np.array(table.packed, dtype=np.uint8, order="C")  # a writable in-memory copy
    need = (n_vocab + 7) // 8
    if bits.ndim != 2 or bits.shape[0] < n_vocab or bits.shape[1] < need:
        raise ValueError(
            f"{path}: legality rows have shape {bits.shape}, need at least ({n_vocab}, {need})"
        )
    return torch.from_numpy(bits)


def save_rows_table(encoding_name: str, prev_ids: np.ndarray, path: str | Path) -> Path:
    """Build the legality rows of just the previous tokens ``prev_ids`` (``int [N]``) and save
    them as a full table file (tokenmill's header, 1 = possible) whose other rows allow every
    next token: sound (never masks a possible pair) and quick for masked validation on a
    small set, where only the validation inputs' rows are ever read.

    Returns:
        the file written (:meth:`LegalityTable.save` naming, atomic).
    """
    rows = np.unique(np.asarray(prev_ids, dtype=np.int64))
    part = LegalityTable.build(encoding_name, rows=rows)
    V = part.n_vocab
    bits = np.full((V, part.row_bytes), 0xFF, dtype=np.uint8)
    if V % 8:
        bits[:, -1] = np.uint8((1 << (V % 8)) - 1)
    bits[rows] = np.asarray(part.packed)
    meta = {**part.meta, "rows_built": int(len(rows)),
            "other_rows": "every next token possible (not built)"}
    return LegalityTable(part.identity, bits, meta).save(path)


def _lem_kwargs(cfg: TrainConfig) -> dict:
    kw: dict = {"max_len": cfg.lem_max_len}
    if cfg.lem_window is not None:
        kw["window"] = cfg.lem_window
    return kw


class LEMFeed:
    """Trainer side of the LEM side input: :class:`~tokenmill.ngram.stream.LEMStream` runs the
    online predictor (per-step causality: matches only from earlier steps, modded-nanogpt
    PR #367) in its own process over this rank's batches in loader order, up to
    ``lem_ahead`` steps ahead of the trainer.

    Each rank's predictor sees that rank's own rows. On resume the producer replays the
    stream from step 0 (the predictor's history must be the same), and the trainer discards
    the replayed steps, so resumed runs see the same features as uninterrupted ones.

    ``get(step)`` returns ``(match_len int32 [B, T], candidates int32 [B, T, K])`` (copies)
    and accumulates ``wait_s``, the seconds the trainer blocked on the predictor;
    ``lag`` is how many steps the predictor is ahead (the ``lem_lag`` of the progress bar).
    """

    def __init__(self, cfg: TrainConfig, rank: int, world: int, eot: int) -> None:
        def batches():
            loader = open_loader(cfg, "train", rank, world, verify=False)
            while True:
                yield loader.next_batch()["inputs"].numpy()

        self.stream = LEMStream(batches(), (cfg.batch_size, cfg.seq_len), eot=eot,
                                k=cfg.lem_k, n_steps=cfg.steps, ahead=cfg.lem_ahead,
                                mode="step", **_lem_kwargs(cfg))
        self.wait_s = 0.0
        self.lag_sum = 0
        self.lag_n = 0

    def skip_to(self, step: int) -> None:
        """Consume (and drop) steps ``0 .. step - 1`` after a resume."""
        for s in range(step):
            self.stream.get(s)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The features of global step ``step`` (steps are read in order)."""
        t0 = time.perf_counter()
        ml, cand = self.stream.get(step)
        out = torch.from_numpy(ml.copy()), torch.from_numpy(cand.copy())
        self.wait_s += time.perf_counter() - t0
        self.lag_sum += self.lag
        self.lag_n += 1
        return out

    @property
    def lag(self) -> int:
        """Steps the predictor is ahead of the trainer right now (0: the trainer waits)."""
        return int(self.stream.counters["lag"])

    @property
    def mean_lag(self) -> float:
        """Mean of :attr:`lag` over the steps read so far."""
        return self.lag_sum / self.lag_n if self.lag_n else float("nan")

    def close(self) -> None:
        """Stop the predictor process."""
        self.stream.close()


def lem_for_validation(cfg: TrainConfig, val: torch.Tensor, eot: int,
                       prime_tokens: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """LEM side input for the fixed validation rows: an
    :class:`~tokenmill.ngram.lem.OnlineLEM` (per-position causality) primed with the first
    ``prime_tokens`` tokens of the training stream (the first steps' batches of a fresh
    loader), then run over the validation inputs row by row. The same features at every
    evaluation, so validation losses are comparable across steps.

    Returns:
        ``(match_len int32 [Nv, T], candidates int32 [Nv, T, K])``.
    """
    lem = OnlineLEM(eot=eot, k=cfg.lem_k, mode="position", **_lem_kwargs(cfg))
    loader = open_loader(cfg, "train", verify=False)
    per = cfg.batch_size * cfg.seq_len
    for _ in range(max(1, min(prime_tokens // per, cfg.steps))):
        lem.step(loader.next_batch()["inputs"].numpy())
    ml, cand = lem.step(val[:, :-1].numpy())
    return ml.copy(), cand.copy()
