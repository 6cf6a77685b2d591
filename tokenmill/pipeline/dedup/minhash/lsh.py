"""LSH banding of MinHash signatures: the (bands, rows) choice and the candidate edges of
a range of bands (Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets*
ch. 3; the weighted choice is datasketch's ``_optimal_param``)."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int, false_positive_weight: float = 0.2,
               false_negative_weight: float = 0.8) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm`` minimizing the weighted
    integrated false-positive and false-negative probability of the LSH S-curve
    ``1 - (1 - s**rows)**bands`` around ``threshold`` (datasketch ``_optimal_param``).

    Raises:
        ValueError: threshold outside (0, 1) or weights not summing to 1.
    """
    from datasketch.lsh import _optimal_param

    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if abs(false_positive_weight + false_negative_weight - 1.0) > 1e-9:
        raise ValueError("false_positive_weight + false_negative_weight must be 1")
    b, r = _optimal_param(threshold, num_perm, false_positive_weight, false_negative_weight)
    return int(b), int(r)


def band_edges(sig: np.ndarray, valid: np.ndarray, band_lo: int, band_hi: int,
               rows: int) -> np.ndarray:
    """Candidate edges of bands ``[band_lo, band_hi)``.

    For every band, documents whose ``rows`` signature values in that band are all equal
    share a bucket; each bucket member is linked to the bucket's lowest index. Returns an
    int64 ``(m, 2)`` array of ``(lowest index, member index)``, unique, sorted. Rows with
    ``valid == False`` (empty documents) take part in no bucket.
    """
    idx_valid = np.flatnonzero(valid)
    out = []
    for band in range(band_lo, band_hi):
        block = np.ascontiguousarray(sig[idx_valid, band * rows:(band + 1) * rows])
        if block.shape[0] < 2:
            continue
        keys = block.view(np.dtype((np.void, block.dtype.itemsize * rows))).ravel()
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        new_group = np.ones(len(sk), bool)
        new_group[1:] = sk[1:] != sk[:-1]
        group_id = np.cumsum(new_group) - 1
        first_pos = np.flatnonzero(new_group)
        first = order[first_pos][group_id]
        member = order
        dup = ~new_group
        if dup.any():
            e = np.stack([idx_valid[first[dup]], idx_valid[member[dup]]], axis=1)
            out.append(e)
    if not out:
        return np.empty((0, 2), np.int64)
    return np.unique(np.concatenate(out).astype(np.int64), axis=0)
