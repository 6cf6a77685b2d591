"""The LEM feature kernel family and its torch reference.

:func:`lem_feature`: the longest-exact-match (LEM) side input: for each position the mean of
  the embedding rows of its candidate next tokens, times a learned per-bucket scale, plus a
  learned per-bucket embedding; zero where there is no match. Backward scatters gradients to
  the embedding table, the scales and the bucket embeddings with atomic adds.

Dispatch (:mod:`tokenmill.train.kernels.dispatch`): CUDA tensors run the compiled kernels,
CPU tensors the interpreter under ``TRITON_INTERPRET=1``, else :func:`lem_feature_reference`,
the straightforward autograd version the kernels are checked against.
"""

import torch
import triton
import triton.language as tl

from tokenmill.train.kernels.dispatch import backend_for, kernel

# ----------------------------------------------------------------------------------------------
# LEM feature gather
# ----------------------------------------------------------------------------------------------


def _lem_fwd_kernel(
    cand_ptr,
    bucket_ptr,
    emb_ptr,
    emb_stride,
    scale_ptr,
    bemb_ptr,
    out_ptr,
    D,
    K: tl.constexpr,
    HAS_BEMB: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dcols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = dcols < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    cnt = 0.0
    for k in range(K):
        # broadcast the scalar id to the block: the interpreter rejects scalar & block masks
        c = tl.zeros([BLOCK_D], dtype=tl.int64) + tl.load(cand_ptr + row * K + k).to(tl.int64)
        valid = c >= 0
        csafe = tl.where(valid, c, 0)
        e = tl.load(emb_ptr + csafe * emb_stride + dcols, mask=dmask & valid, other=0.0)
        acc += e.to(tl.float32)
        cnt += tl.where(tl.load(cand_ptr + row * K + k) >= 0, 1.0, 0.0)
    mean = acc / tl.maximum(cnt, 1.0)
    b = tl.load(bucket_ptr + row).to(tl.int64)
    has = b >= 0
    bsafe = tl.where(has, b, 0)
    sc = tl.load(scale_ptr + bsafe).to(tl.float32)
    out = mean * sc
    if HAS_BEMB:
        out += tl.load(bemb_ptr + bsafe * D + dcols, mask=dmask, other=0.0).to(tl.float32)
    out = tl.where(has, out, 0.0)
    tl.store(out_ptr + row * D + dcols, out.to(out_ptr.dtype.element_ty), mask=dmask)


def _lem_bwd_kernel(
    cand_ptr,
    bucket_ptr,
    emb_ptr,
    emb_stride,
    scale_ptr,
    gout_ptr,
    gemb_ptr,
    gscale_ptr,
    gbemb_ptr,
    D,
    K: tl.constexpr,
    HAS_BEMB: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dcols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = dcols < D
    b = tl.load(bucket_ptr + row).to(tl.int64)
    has = b >= 0
    bsafe = tl.where(has, b, 0)
    hasv = (tl.zeros([BLOCK_D], dtype=tl.int64) + b) >= 0
    g = tl.load(gout_ptr + row * D + dcols, mask=dmask & hasv, other=0.0).to(tl.float32)
    sc = tl.load(scale_ptr + bsafe).to(tl.float32)
    cnt = 0.0
    for k in range(K):
        c = tl.load(cand_ptr + row * K + k)
        cnt += tl.where(c >= 0, 1.0, 0.0)
    inv = 1.0 / tl.maximum(cnt, 1.0)
    ge = g * (sc * inv)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in range(K):
        c = tl.zeros([BLOCK_D], dtype=tl.int64) + tl.load(cand_ptr + row * K + k).to(tl.int64)
        valid = (c >= 0) & hasv
        csafe = tl.where(valid, c, 0)
        m = dmask & valid
        e = tl.load(emb_ptr + csafe * emb_stride + dcols, mask=m, other=0.0)
        acc += e.to(tl.float32)
        tl.atomic_add(gemb_ptr + csafe * D + dcols, ge, mask=m)
    dscale = tl.sum(g * acc, 0) * inv
    tl.atomic_add(gscale_ptr + bsafe, dscale, mask=has)
    if HAS_BEMB:
        tl.atomic_add(gbemb_ptr + bsafe * D + dcols, g, mask=dmask & hasv)


def _lem_block(d: int) -> int:
    return min(triton.next_power_of_2(d), 1024)


class _LEMFeature(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cand, bucket, emb, scale, bucket_emb):
        n, k = cand.shape
        d = emb.shape[1]
        backend = backend_for(emb)
        bd = _lem_block(d)
        cand = cand.contiguous()
        bucket = bucket.contiguous()
        if emb.stride(1) != 1:
            emb = emb.contiguous()
        scale_c = scale.contiguous()
        has_bemb = bucket_emb is not None
        bemb = bucket_emb.contiguous() if has_bemb else scale_c
        out = torch.empty(n, d, dtype=emb.dtype, device=emb.device)
        if n > 0 and k > 0:
            kernel(_lem_fwd_kernel, backend)[(n, triton.cdiv(d, bd))](
                cand, bucket, emb, emb.stride(0), scale_c, bemb, out, d,
                K=k, HAS_BEMB=has_bemb, BLOCK_D=bd,
            )
        elif n > 0:
            out.zero_()
        ctx.save_for_backward(cand, bucket, emb, scale_c)
        ctx.meta = (has_bemb, bd, backend, emb.shape, scale.shape,
                    bucket_emb.shape if has_bemb else None, bucket_emb.dtype if has_bemb else None)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        cand, bucket, emb, scale = ctx.saved_tensors
        has_bemb, bd, backend, emb_shape, scale_shape, bemb_shape, bemb_dtype = ctx.meta
        n, k = cand.shape
        d = emb_shape[1]
        dev = emb.device
        gemb = torch.zeros(emb_shape, dtype=torch.float32, device=dev)
        gscale = torch.zeros(scale_shape, dtype=torch.float32, device=dev)
        gbemb = torch.zeros(bemb_shape, dtype=torch.float32, device=dev) if has_bemb else gscale
        if n > 0 and k > 0:
            kernel(_lem_bwd_kernel, backend)[(n, triton.cdiv(d, bd))](
                cand, bucket, emb, emb.stride(0), scale, grad_out.contiguous(),
                gemb, gscale, gbemb, d, K=k, HAS_BEMB=has_bemb, BLOCK_D=bd,
            )
        return (
            None,
            None,
            gemb.to(emb.dtype),
            gscale.to(scale.dtype),
            gbemb.to(bemb_dtype) if has_bemb else None,
        )


def _check_lem_args(cand, bucket, emb, scale, bucket_emb):
    if cand.dim() != 2:
        raise ValueError(f"candidates must be [N, K], got shape {tuple(cand.shape)}")
    n = cand.shape[0]
    if bucket.shape != (n,):
        raise ValueError(f"buckets must be [N={n}], got shape {tuple(bucket.shape)}")
    if emb.dim() != 2:
        raise ValueError(f"embedding must be [V, D], got shape {tuple(emb.shape)}")
    if scale.dim() != 1:
        raise ValueError(f"scale must be [n_buckets], got shape {tuple(scale.shape)}")
    if bucket_emb is not None and bucket_emb.shape != (scale.shape[0], emb.shape[1]):
        raise ValueError(
            f"bucket_emb must be [n_buckets={scale.shape[0]}, D={emb.shape[1]}], got "
            f"{tuple(bucket_emb.shape)}"
        )


def lem_feature(
    candidates: torch.Tensor,
    buckets: torch.Tensor,
    embedding: torch.Tensor,
    scale: torch.Tensor,
    bucket_emb: torch.Tensor | None = None,
) -> torch.Tensor:
    """The longest-exact-match side input added to the residual stream.

    ``out[n] = mean_{k: cand[n,k] >= 0} embedding[cand[n,k]] * scale[b] + bucket_emb[b]`` with
    ``b = buckets[n]``; ``out[n] = 0`` where ``b < 0`` (no match). Where ``b >= 0`` but no
    candidate is valid, the mean term is 0 and only ``bucket_emb[b]`` is added.

    Args:
        candidates: ``int32/int64 [N, K]`` candidate next-token ids, ``-1`` = none.
        buckets: ``int [N]`` match-length bucket index in ``[0, n_buckets)``, ``-1`` = no match.
        embedding: ``[V, D]`` token embedding table (float32 or bfloat16); gets a gradient.
        scale: ``[n_buckets]`` learned per-bucket scale; gets a gradient.
        bucket_emb: optional ``[n_buckets, D]`` learned per-bucket embedding; gets a gradient.

    Returns:
        ``[N, D]`` in ``embedding.dtype``.

    Gradients accumulate in fp32 with atomic adds (the order of float additions, hence the
    last bits, may vary between runs on a GPU). Tolerance against
    :func:`lem_feature_reference`: fp32 ``atol=1e-5, rtol=1e-5``.
    Source: the speedrun's "longest exact match" side input (modded-nanogpt record notes).
    """
    _check_lem_args(candidates, buckets, embedding, scale, bucket_emb)
    if backend_for(embedding) == "torch":
        return lem_feature_reference(candidates, buckets, embedding, scale, bucket_emb)
    return _LEMFeature.apply(candidates, buckets, embedding, scale, bucket_emb)


def lem_feature_reference(
    candidates: torch.Tensor,
    buckets: torch.Tensor,
    embedding: torch.Tensor,
    scale: torch.Tensor,
    bucket_emb: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch version of :func:`lem_feature` (materializes ``[N, K, D]``)."""
    _check_lem_args(candidates, buckets, embedding, scale, bucket_emb)
    valid = candidates >= 0
    e = embedding[candidates.long().clamp_min(0)].float() * valid.unsqueeze(-1)
    cnt = valid.sum(1).clamp_min(1).to(torch.float32)
    mean = e.sum(1) / cnt[:, None]
    has = buckets >= 0
    b = buckets.long().clamp_min(0)
    out = mean * scale[b].float()[:, None]
    if bucket_emb is not None:
        out = out + bucket_emb[b].float()
    out = out * has[:, None]
    return out.to(embedding.dtype)
