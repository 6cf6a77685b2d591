"""Triton kernels for the trainer, one module per kernel family, each beside the plain torch
reference it must match:

* :mod:`tokenmill.train.kernels.cross_entropy`: :func:`fused_cross_entropy` (chunked online
  softmax, optional prefix auxiliary target, legality mask and sparse logit bias) and
  :func:`cross_entropy_reference`; the legality mask rows' packing
  (:func:`pack_mask_rows`, :func:`masked_target_count`);
* :mod:`tokenmill.train.kernels.lem_feature`: :func:`lem_feature` (the LEM side input's
  gather) and :func:`lem_feature_reference`;
* :mod:`tokenmill.train.kernels.dispatch`: which implementation a call runs
  (:func:`backend_for`: compiled on CUDA, interpreted on CPU under ``TRITON_INTERPRET=1``,
  else plain torch).
"""

from tokenmill.train.kernels.cross_entropy import (
    cross_entropy_reference,
    fused_cross_entropy,
    masked_target_count,
    pack_mask_rows,
)
from tokenmill.train.kernels.dispatch import backend_for
from tokenmill.train.kernels.lem_feature import lem_feature, lem_feature_reference

__all__ = [
    "backend_for",
    "cross_entropy_reference",
    "fused_cross_entropy",
    "lem_feature",
    "lem_feature_reference",
    "masked_target_count",
    "pack_mask_rows",
]
