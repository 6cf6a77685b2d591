"""The tokenizer's tables a run reads beside the tokens, opened once: :func:`open_tables`.

:class:`TokenTables` holds them for the run's tokenizer (the one the data records):

* prefix auxiliary target: the longest proper token prefix of each target
  (:class:`tokenmill.tokenizers.prefix.PrefixMap`), trained with a weighted second
  cross-entropy term (partial credit for a prefix of the right token);
* legality mask: packed rows of the tokenizer's possible (previous, next) pairs from a saved
  :class:`tokenmill.tokenizers.legality.LegalityTable` (polarity read from its header), used
  at evaluation only.

Both are checked against the tokenizer the run's data records, which is loaded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tokenmill.tokenizers.identities import TokenizerIdentity
from tokenmill.tokenizers.legality import LegalityTable
from tokenmill.tokenizers.prefix import PrefixMap
from tokenmill.tokenizers.registry import check_same, load_checked
from tokenmill.train.config import TrainConfig


@dataclass(frozen=True)
class TokenTables:
    """The tokenizer tables of a run, opened once by :func:`open_tables`.

    Attributes:
        mask_bits: packed legality rows ``uint8 [n_vocab, ceil(n_vocab / 8)]`` (LSB-first,
            1 = possible), for masked validation; ``None`` without ``legality:``.
        prefix: ``int64 [n_vocab]``, the longest proper token prefix of each token (-1 if
            none), the prefix auxiliary target; ``None`` when ``prefix_aux_weight`` is 0.
    """

    mask_bits: torch.Tensor | None = None
    prefix: torch.Tensor | None = None


def open_tables(cfg: TrainConfig, tokenizer: TokenizerIdentity, where: str,
                device: torch.device | None = None) -> TokenTables:
    """The tables ``cfg`` asks for, on ``device`` (default: the CPU), checked against
    ``tokenizer``, the identity the run's data records (``where``: the manifest that
    records it): the legality rows of ``cfg.legality`` (:func:`load_mask_bits`) and, with
    ``prefix_aux_weight > 0``, the prefix map of the tokenizer loaded once
    (:func:`tokenmill.tokenizers.load_checked`, :class:`~tokenmill.tokenizers.prefix.PrefixMap`).

    Raises:
        LegalityFormatError, TokenizerMismatchError: as :func:`load_mask_bits`.
        TokenizerMismatchError, ValueError, RuntimeError: the tokenizer cannot be loaded, or
            the one installed is not the data's (:func:`tokenmill.tokenizers.load_checked`).
    """
    mask_bits = prefix = None
    if cfg.legality:
        mask_bits = load_mask_bits(cfg.legality, tokenizer).to(device)
    if cfg.prefix_aux_weight > 0:
        enc = load_checked(tokenizer, where)
        prefix = torch.from_numpy(PrefixMap.of_encoding(enc).parent).long().to(device)
    return TokenTables(mask_bits, prefix)


def load_mask_bits(path: str, tokenizer: TokenizerIdentity | None = None) -> torch.Tensor:
    """Packed legality rows ``uint8 [n_vocab, ceil(n_vocab/8)]`` (LSB-first, 1 = possible) of
    a saved :class:`~tokenmill.tokenizers.legality.LegalityTable` file or folder, whose
    rows cover the vocabulary of the table's tokenizer; with ``tokenizer``, that must be
    the one given, and in a folder holding several tables its ``<name>.legality`` (as
    :meth:`LegalityTable.save` names it) is the one read.

    Every file goes through :meth:`LegalityTable.load`, which reads what a set bit means from
    the file's own header: tokenmill's tables (1 = possible) are used as they are, an export
    in modded-nanogpt's forbidden-pair polarity (``tokenmill legality export --format
    modded-nanogpt``) is inverted, and a file that does not state its polarity (a bare
    ``.npy`` mask) is refused, never guessed.

    Raises:
        LegalityFormatError: not a table file, a header without polarity, or rows that do
            not cover the table's vocabulary (a ValueError).
        TokenizerMismatchError: the table is another tokenizer's than ``tokenizer``.
    """
    own = Path(path, f"{tokenizer.name}.legality") if tokenizer is not None else None
    table = LegalityTable.load(own if own is not None and own.is_file() else Path(path))
    if tokenizer is not None:
        check_same(tokenizer, table.identity, f"legality table {path}")
    return torch.from_numpy(np.array(table.packed, dtype=np.uint8, order="C"))  # writable


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
