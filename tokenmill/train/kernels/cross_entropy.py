"""The fused cross-entropy kernel family and its torch reference.

:func:`fused_cross_entropy`: cross-entropy forward and backward over the vocabulary in
  chunks of ``BLOCK_V`` columns with an online (running max / running sum) softmax, so the
  full fp32 softmax of the batch is never materialized: the forward keeps only one
  log-sum-exp per row, the backward recomputes ``exp(logit - lse)`` chunk by chunk and writes
  the gradient in the dtype of the logits. Optional extras:

  - an auxiliary target per position with a weight (the prefix-token loss: partial credit for
    the longest-token prefix of the target, see ``tokenmill.tokenizers.prefix``);
  - a legality mask as packed bit rows indexed by the previous token id: tokens that cannot
    follow the previous token get zero probability, and the softmax is renormalized over the
    allowed tokens only (the NanoGPT speedrun's impossible-continuation mask);
  - a sparse additive bias: ``M`` (token id, value) pairs per position added to those logits
    inside each vocabulary chunk (``tl.where(cols == id_j, ...)`` over a constexpr ``M``
    loop), with the gradient of each value read off the chunk that holds its column (the
    n-gram model's log-probabilities of its top-``M`` candidates, gated, as in the speedrun's
    n-gram record).

  The chunked online softmax follows Milakov & Gimelshein, "Online normalizer calculation for
  softmax" (2018); the row-per-program layout follows Liger-Kernel's ``cross_entropy`` kernel.

Dispatch (:mod:`tokenmill.train.kernels.dispatch`): CUDA tensors run the compiled kernels,
CPU tensors the interpreter under ``TRITON_INTERPRET=1``, else a lean autograd Function with
the same maths (one in-place backward pass). :func:`cross_entropy_reference` is the
straightforward autograd version the kernels are checked against.

Legality mask bit order
-----------------------
``mask_bits`` is ``uint8 [V_rows, ceil(V / 8)]``; bit ``j`` of row ``r`` is 1 when token ``j``
may follow previous token ``r``. Bits are **LSB-first within each byte**: token ``j`` is bit
``j % 8`` (value ``1 << (j % 8)``) of byte ``j // 8``, exactly what
``numpy.packbits(allowed, axis=-1, bitorder="little")`` produces. :func:`pack_mask_rows` and
:func:`tokenmill.tokenizers.legality.unpack_rows_torch` convert.
"""

import torch
import triton
import triton.language as tl

from tokenmill.tokenizers.legality import unpack_rows_torch
from tokenmill.train.kernels.dispatch import backend_for, kernel


def pack_mask_rows(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a boolean ``[R, V]`` allowed-table into ``uint8 [R, ceil(V/8)]`` rows, LSB-first
    (``numpy.packbits(..., bitorder="little")`` semantics)."""
    if allowed.dim() != 2:
        raise ValueError(f"allowed must be 2-D [R, V], got shape {tuple(allowed.shape)}")
    r, v = allowed.shape
    nbytes = (v + 7) // 8
    a = torch.zeros(r, nbytes * 8, dtype=torch.uint8, device=allowed.device)
    a[:, :v] = allowed.to(torch.uint8)
    weights = (1 << torch.arange(8, device=allowed.device)).to(torch.uint8)
    return (a.view(r, nbytes, 8) * weights).sum(-1, dtype=torch.int32).to(torch.uint8)


def masked_target_count(
    targets: torch.Tensor, prev_ids: torch.Tensor, mask_bits: torch.Tensor
) -> int:
    """Number of positions whose (non-ignored, ``>= 0``) target is marked impossible after its
    previous token. A sound legality table gives 0 on real data; a non-zero count means the
    masked loss of those positions is infinite."""
    t = targets.reshape(-1).long()
    p = prev_ids.reshape(-1).long()
    ok = t >= 0
    t, p = t[ok], p[ok]
    byte = mask_bits[p, t >> 3].to(torch.int32)
    bit = (byte >> (t & 7).to(torch.int32)) & 1
    return int((bit == 0).sum())


# ----------------------------------------------------------------------------------------------
# fused cross-entropy
# ----------------------------------------------------------------------------------------------


def _ce_fwd_kernel(
    logits_ptr,
    stride_row,
    tgt_ptr,
    aux_ptr,
    auxw_ptr,
    prev_ptr,
    bits_ptr,
    bits_stride,
    bid_ptr,
    bval_ptr,
    loss_ptr,
    lse_ptr,
    V,
    HAS_AUX: tl.constexpr,
    HAS_MASK: tl.constexpr,
    M: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # M > 0: sparse bias, z'[c_j] += b_j for the M (id, value) pairs of the row (ids outside
    # [0, V) never match a column; duplicates add up), applied chunk by chunk
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    tgt = tl.load(tgt_ptr + row).to(tl.int64)
    if HAS_MASK:
        prev = tl.load(prev_ptr + row).to(tl.int64)
        brow = bits_ptr + prev * bits_stride
    m = float("-inf")
    s = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inb = cols < V
        x = tl.load(base + cols, mask=inb, other=float("-inf")).to(tl.float32)
        if HAS_MASK:
            byte = tl.load(brow + (cols >> 3), mask=inb, other=0).to(tl.int32)
            ok = ((byte >> (cols & 7)) & 1) != 0
            x = tl.where(ok, x, float("-inf"))
        for j in tl.static_range(M):
            cj = tl.load(bid_ptr + row * M + j).to(tl.int64)
            x += tl.where(cols == cj, tl.load(bval_ptr + row * M + j), 0.0)
        m_new = tl.maximum(m, tl.max(x, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), 0)
        m = m_new
    lse = tl.where(s > 0.0, m + tl.log(s), float("-inf"))
    valid = tgt >= 0
    tsafe = tl.where(valid, tgt, 0)
    xt = tl.load(base + tsafe).to(tl.float32)
    if HAS_MASK:
        tb = tl.load(brow + (tsafe >> 3)).to(tl.int32)
        xt = tl.where(((tb >> (tsafe & 7).to(tl.int32)) & 1) != 0, xt, float("-inf"))
    if M > 0:
        aux0 = tsafe
        if HAS_AUX:
            aux0 = tl.load(aux_ptr + row).to(tl.int64)
        bt = 0.0
        ba = 0.0
        for j in tl.static_range(M):
            cj = tl.load(bid_ptr + row * M + j).to(tl.int64)
            bj = tl.load(bval_ptr + row * M + j)
            bt += tl.where(cj == tsafe, bj, 0.0)
            ba += tl.where(cj == aux0, bj, 0.0)
        xt += bt
    loss = tl.where(valid, lse - xt, 0.0)
    if HAS_AUX:
        aux = tl.load(aux_ptr + row).to(tl.int64)
        w = tl.load(auxw_ptr + row).to(tl.float32)
        avalid = valid & (aux >= 0)
        asafe = tl.where(avalid, aux, 0)
        xa = tl.load(base + asafe).to(tl.float32)
        if HAS_MASK:
            ab = tl.load(brow + (asafe >> 3)).to(tl.int32)
            avalid = avalid & (((ab >> (asafe & 7).to(tl.int32)) & 1) != 0)
        if M > 0:
            xa += ba
        loss = loss + tl.where(avalid & (w != 0.0), w * (lse - xa), 0.0)
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, lse)


def _ce_bwd_kernel(
    logits_ptr,
    stride_row,
    grad_ptr,
    stride_grow,
    gout_ptr,
    lse_ptr,
    tgt_ptr,
    aux_ptr,
    auxw_ptr,
    prev_ptr,
    bits_ptr,
    bits_stride,
    bid_ptr,
    bval_ptr,
    gbias_ptr,
    V,
    NCOLS,
    HAS_AUX: tl.constexpr,
    HAS_MASK: tl.constexpr,
    M: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # columns in [V, NCOLS) (vocabulary padding) get a zero gradient; M > 0: the sparse
    # bias enters the recomputed softmax and gbias[row, j] = dL/dz'[row, c_j] is written by
    # the block holding column c_j (left 0 for ids outside [0, V))
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    inb = cols < V
    tgt = tl.load(tgt_ptr + row).to(tl.int64)
    valid = tgt >= 0
    g = tl.load(gout_ptr + row).to(tl.float32)
    g = tl.where(valid, g, 0.0)
    lse = tl.load(lse_ptr + row)
    lse_safe = tl.where(lse == float("-inf"), 0.0, lse)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=inb, other=float("-inf"))
    x = x.to(tl.float32)
    if HAS_MASK:
        prev = tl.load(prev_ptr + row).to(tl.int64)
        byte = tl.load(bits_ptr + prev * bits_stride + (cols >> 3), mask=inb, other=0)
        ok = ((byte.to(tl.int32) >> (cols & 7)) & 1) != 0
        x = tl.where(ok, x, float("-inf"))
    for j in tl.static_range(M):
        cj = tl.load(bid_ptr + row * M + j).to(tl.int64)
        x += tl.where(cols == cj, tl.load(bval_ptr + row * M + j), 0.0)
    p = tl.exp(x - lse_safe)
    coef = 1.0
    grad = -tl.where(cols == tgt, 1.0, 0.0)
    if HAS_AUX:
        aux = tl.load(aux_ptr + row).to(tl.int64)
        w = tl.load(auxw_ptr + row).to(tl.float32)
        avalid = aux >= 0
        if HAS_MASK:
            asafe = tl.where(avalid, aux, 0)
            ab = tl.load(bits_ptr + prev * bits_stride + (asafe >> 3)).to(tl.int32)
            avalid = avalid & (((ab >> (asafe & 7).to(tl.int32)) & 1) != 0)
        w = tl.where(avalid, w, 0.0)
        coef = coef + w
        grad = grad - tl.where(cols == aux, w, 0.0)
    grad = (grad + coef * p) * g
    tl.store(grad_ptr + row * stride_grow + cols, grad.to(grad_ptr.dtype.element_ty),
             mask=cols < NCOLS)
    lo = blk * BLOCK_V
    for j in tl.static_range(M):
        cj = tl.load(bid_ptr + row * M + j).to(tl.int64)
        gj = tl.sum(tl.where((cols == cj) & inb, grad, 0.0), 0)
        tl.store(gbias_ptr + row * M + j, gj, mask=(cj >= lo) & (cj < lo + BLOCK_V) & (cj < V))


def _ce_block(v: int, block_v: int | None, backend: str) -> int:
    if block_v is not None:
        return int(block_v)
    cap = 4096 if backend == "triton" else 1024
    return min(triton.next_power_of_2(v), cap)


class _FusedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, aux_targets, aux_weight, prev_ids, mask_bits, bias_ids,
                bias_vals, block_v, v):
        n = logits.shape[0]
        backend = backend_for(logits)
        bv = _ce_block(v, block_v, backend)
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        targets = targets.contiguous()
        has_aux = aux_targets is not None
        has_mask = mask_bits is not None
        m = 0 if bias_ids is None else bias_ids.shape[1]
        dummy = targets
        aux = aux_targets.contiguous() if has_aux else dummy
        auxw = aux_weight.contiguous() if has_aux else dummy
        prev = prev_ids.contiguous() if has_mask else dummy
        bits = mask_bits if has_mask else dummy
        bits_stride = mask_bits.stride(0) if has_mask else 0
        bid = bias_ids.contiguous() if m else dummy
        bval = bias_vals.detach().float().contiguous() if m else _f32_dummy(logits)
        loss = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        if n > 0:
            k = kernel(_ce_fwd_kernel, backend)
            k[(n,)](
                logits, logits.stride(0), targets, aux, auxw, prev, bits, bits_stride,
                bid, bval, loss, lse, v, HAS_AUX=has_aux, HAS_MASK=has_mask, M=m, BLOCK_V=bv,
                num_warps=8 if bv >= 2048 else 4,
            )
        ctx.save_for_backward(logits, lse, targets, aux, auxw, prev, bits, bid, bval)
        ctx.meta = (has_aux, has_mask, bits_stride, bv, backend, v, m)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, grad_loss, _grad_lse):
        logits, lse, targets, aux, auxw, prev, bits, bid, bval = ctx.saved_tensors
        has_aux, has_mask, bits_stride, bv, backend, v, m = ctx.meta
        n, ncols = logits.shape
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        gbias = torch.zeros(n, max(m, 1), dtype=torch.float32, device=logits.device)
        if n > 0:
            k = kernel(_ce_bwd_kernel, backend)
            k[(n, triton.cdiv(ncols, bv))](
                logits, logits.stride(0), grad, grad.stride(0), grad_loss.contiguous(), lse,
                targets, aux, auxw, prev, bits, bits_stride, bid, bval, gbias, v, ncols,
                HAS_AUX=has_aux, HAS_MASK=has_mask, M=m, BLOCK_V=bv,
                num_warps=8 if bv >= 2048 else 4,
            )
        return (grad, None, None, None, None, None, None, gbias if m else None, None, None)


def _f32_dummy(like: torch.Tensor) -> torch.Tensor:
    """A one-element fp32 placeholder for an unused float pointer argument."""
    return torch.zeros(1, dtype=torch.float32, device=like.device)


def _dense_bias(bias_ids: torch.Tensor, bias_vals: torch.Tensor, v: int) -> torch.Tensor:
    """``float32 [N, v]``: the sparse bias scattered (ids outside ``[0, v)`` dropped,
    duplicates summed); differentiable w.r.t. ``bias_vals``."""
    ids = bias_ids.long()
    ok = (ids >= 0) & (ids < v)
    dense = torch.zeros(ids.shape[0], v + 1, dtype=torch.float32, device=ids.device)
    vals = torch.where(ok, bias_vals.float(), torch.zeros((), device=ids.device))
    return dense.scatter_add(1, torch.where(ok, ids, v), vals)[:, :v]


def _add_sparse_bias(x: torch.Tensor, bias_ids: torch.Tensor, bias_vals: torch.Tensor
                     ) -> torch.Tensor:
    """``x`` (``float32 [N, v]``) plus the sparse bias, out of place, without a dense bias
    tensor (ids outside ``[0, v)`` dropped, duplicates summed)."""
    v = x.shape[1]
    ids = bias_ids.long()
    ok = (ids >= 0) & (ids < v)
    vals = torch.where(ok, bias_vals.float(), torch.zeros((), device=x.device))
    return x.scatter_add(1, ids.clamp(0, v - 1), vals)


class _TorchCrossEntropy(torch.autograd.Function):
    """CPU path without Triton: the same maths as the kernels in a few in-place torch passes
    (forward keeps only the log-sum-exp; backward writes ``coef * softmax - onehots`` once),
    so CPU training does not pay for autograd's chain of full-size temporaries."""

    @staticmethod
    def forward(ctx, logits, targets, aux_targets, aux_weight, prev_ids, mask_bits, bias_ids,
                bias_vals, v):
        n, ncols = logits.shape
        x = logits[:, :v].float()
        if bias_ids is not None:
            x = _add_sparse_bias(x, bias_ids, bias_vals.detach())
        allowed = None
        if mask_bits is not None:
            allowed = unpack_rows_torch(mask_bits[prev_ids.long()], v)
            x = x.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(x, dim=-1)
        t = targets.long()
        valid = t >= 0
        rows = torch.arange(n, device=x.device)
        zero = torch.zeros((), device=x.device)
        loss = torch.where(valid, lse - x[rows, t.clamp_min(0)], zero)
        w = None
        a = None
        if aux_targets is not None:
            a = aux_targets.long()
            avalid = valid & (a >= 0)
            if allowed is not None:
                avalid &= allowed[rows, a.clamp_min(0)]
            w = torch.where(avalid, aux_weight.float(), zero)
            loss = loss + torch.where(w != 0, w * (lse - x[rows, a.clamp_min(0)]), zero)
        has_bias = bias_ids is not None
        ctx.save_for_backward(logits, lse, t, a if a is not None else t,
                              w if w is not None else lse, allowed if allowed is not None
                              else lse, bias_ids if has_bias else t,
                              bias_vals.detach() if has_bias else lse)
        ctx.meta = (v, aux_targets is not None, allowed is not None, has_bias)
        return loss

    @staticmethod
    def backward(ctx, gout):
        logits, lse, t, a, w, allowed, bid, bval = ctx.saved_tensors
        v, has_aux, has_mask, has_bias = ctx.meta
        n, ncols = logits.shape
        rows = torch.arange(n, device=logits.device)
        g = torch.where(t >= 0, gout.float(), torch.zeros((), device=logits.device))
        p = logits[:, :v].float()
        if has_bias:
            p = _add_sparse_bias(p, bid, bval)
        p = p.sub(lse[:, None]).exp_()
        if has_mask:
            p.masked_fill_(~allowed, 0.0)
        coef = g * (1.0 + w) if has_aux else g
        p.mul_(coef[:, None])
        tt = t.clamp_min(0)
        p[rows, tt] -= g
        if has_aux:
            p.index_put_((rows, a.clamp_min(0)), -(g * w), accumulate=True)
        gbias = None
        if has_bias:
            ids = bid.long()
            ok = (ids >= 0) & (ids < v)
            gbias = torch.where(ok, p.gather(1, ids.clamp(0, v - 1)), 0.0)
        if ncols > v:
            p = torch.nn.functional.pad(p, (0, ncols - v))
        return p.to(logits.dtype), None, None, None, None, None, None, gbias, None


def _check_bias_args(bias_ids, bias_vals, n: int) -> None:
    if (bias_ids is None) != (bias_vals is None):
        raise ValueError("bias_ids and bias_vals must be given together")
    if bias_ids is None:
        return
    if bias_ids.dim() != 2 or bias_ids.shape[0] != n:
        raise ValueError(f"bias_ids must be [N={n}, M], got shape {tuple(bias_ids.shape)}")
    if bias_vals.shape != bias_ids.shape:
        raise ValueError(f"bias_vals must be [N={n}, M={bias_ids.shape[1]}] like bias_ids, got "
                         f"shape {tuple(bias_vals.shape)}")
    if bias_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"bias_ids must be int32 or int64, got {bias_ids.dtype}")
    if not bias_vals.is_floating_point():
        raise TypeError(f"bias_vals must be floating point, got {bias_vals.dtype}")


def _check_ce_args(logits, targets, aux_targets, aux_weight, prev_ids, mask_bits, v):
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    n = logits.shape[0]
    if not 0 < v <= logits.shape[1]:
        raise ValueError(f"vocab_size {v} outside 1..{logits.shape[1]} (logits columns)")
    if targets.shape != (n,):
        raise ValueError(f"targets must be [N={n}], got shape {tuple(targets.shape)}")
    if aux_targets is not None and aux_targets.shape != (n,):
        raise ValueError(f"aux_targets must be [N={n}], got shape {tuple(aux_targets.shape)}")
    if (mask_bits is None) != (prev_ids is None):
        raise ValueError("mask_bits and prev_ids must be given together")
    if mask_bits is not None:
        if mask_bits.dtype != torch.uint8 or mask_bits.dim() != 2:
            raise TypeError(
                f"mask_bits must be uint8 [V_rows, ceil(V/8)], got {mask_bits.dtype} "
                f"{tuple(mask_bits.shape)}"
            )
        if mask_bits.shape[1] * 8 < v:
            raise ValueError(
                f"mask_bits rows cover {mask_bits.shape[1] * 8} tokens but logits have V={v}"
            )
        if mask_bits.stride(1) != 1:
            raise ValueError("mask_bits must be contiguous along the token axis")
        if prev_ids.shape != (n,):
            raise ValueError(f"prev_ids must be [N={n}], got shape {tuple(prev_ids.shape)}")
    if aux_weight is not None and aux_targets is None:
        raise ValueError("aux_weight given without aux_targets")


def _aux_weight_tensor(aux_weight, n: int, device) -> torch.Tensor:
    if aux_weight is None:
        return torch.ones(n, dtype=torch.float32, device=device)
    if isinstance(aux_weight, torch.Tensor):
        w = aux_weight.to(device=device, dtype=torch.float32)
        return w.expand(n).contiguous() if w.dim() == 0 else w.reshape(n)
    return torch.full((n,), float(aux_weight), dtype=torch.float32, device=device)


def fused_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    aux_targets: torch.Tensor | None = None,
    aux_weight: float | torch.Tensor | None = None,
    prev_ids: torch.Tensor | None = None,
    mask_bits: torch.Tensor | None = None,
    reduction: str = "mean",
    block_v: int | None = None,
    vocab_size: int | None = None,
    bias_ids: torch.Tensor | None = None,
    bias_vals: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy over the vocabulary, chunked, with optional prefix loss, legality mask
    and sparse additive logit bias.

    Args:
        logits: ``[N, V_pad]`` float32 / bfloat16 / float16, stride 1 along the vocabulary.
            Never upcast as a whole: chunks are upcast to fp32 in registers.
        vocab_size: ``V``, the real vocabulary; columns ``[V, V_pad)`` (padding to a multiple
            of 128) are outside the softmax and get a zero gradient. Default ``V_pad``.
        targets: ``int64/int32 [N]``; ``< 0`` (e.g. -100) ignores the position (loss 0, no
            gradient, aux term dropped too).
        aux_targets: optional ``[N]`` auxiliary target (e.g. the longest-token prefix of the
            target); ``< 0`` means none for that position.
        aux_weight: scalar or ``float32 [N]`` weight of the auxiliary term (default 1).
        prev_ids: ``[N]`` previous token id per position (row of ``mask_bits``); required with
            ``mask_bits``.
        mask_bits: ``uint8 [V_rows, ceil(V/8)]`` packed allowed-next rows, LSB-first (see the
            module docstring). The softmax is renormalized over allowed tokens only.
        reduction: ``"none"`` (``float32 [N]``), ``"sum"``, or ``"mean"`` (over non-ignored
            positions).
        block_v: vocabulary chunk width (a power of two); default 4096 compiled, 1024
            interpreted.
        bias_ids, bias_vals: optional sparse bias, ``int32/int64 [N, M]`` token ids and
            ``float [N, M]`` values (e.g. the n-gram model's gated log-probabilities of its
            ``M`` candidates): the softmax is over ``z' = z + b`` with ``b[n, bias_ids[n, j]]
            += bias_vals[n, j]`` (ids outside ``[0, V)``, e.g. -1, ignored; duplicate ids add
            up), added chunk by chunk in fp32, never as a dense ``[N, V]`` tensor.
            Differentiable w.r.t. ``bias_vals``: ``dL/dbias_vals[n, j] = dL/dz'[n,
            bias_ids[n, j]]`` (fp32). A masked-out id stays impossible.

    Returns:
        float32 loss; per position ``(lse - z'[t]) + w * (lse - z'[a])`` where ``lse`` is the
        log-sum-exp of ``z'`` over (allowed) tokens (``z' = z`` without a bias). A target
        marked impossible gives ``+inf`` (count these with :func:`masked_target_count`).

    Memory: besides the gradient (same dtype and shape as ``logits``), only ``2 x N`` fp32.
    Tolerance against :func:`cross_entropy_reference` (tested): fp32 logits
    ``atol=1e-5, rtol=1e-5`` on loss and gradient; bf16 logits ``atol=1e-4, rtol=1e-3`` on
    the loss (fp32 accumulation) and ``atol=1e-2, rtol=2e-2`` on the gradient (rounded to
    bf16).

    Raises:
        ValueError / TypeError: on shape or dtype mismatches, naming the argument.
    """
    v = logits.shape[1] if vocab_size is None else int(vocab_size)
    _check_ce_args(logits, targets, aux_targets, aux_weight, prev_ids, mask_bits, v)
    n = logits.shape[0]
    _check_bias_args(bias_ids, bias_vals, n)
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction must be none/sum/mean, got {reduction!r}")
    auxw = _aux_weight_tensor(aux_weight, n, logits.device) if aux_targets is not None else None
    if bias_ids is not None and bias_ids.shape[1] == 0:
        bias_ids = bias_vals = None
    bvals = bias_vals.float() if bias_vals is not None else None
    if backend_for(logits) == "torch":
        loss = _TorchCrossEntropy.apply(logits, targets, aux_targets, auxw, prev_ids,
                                        mask_bits, bias_ids, bvals, v)
    else:
        loss, _ = _FusedCrossEntropy.apply(
            logits, targets, aux_targets, auxw, prev_ids, mask_bits, bias_ids, bvals,
            block_v, v
        )
    return _reduce(loss, targets, reduction)


def _reduce(loss: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (targets >= 0).sum().clamp_min(1)


def cross_entropy_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    aux_targets: torch.Tensor | None = None,
    aux_weight: float | torch.Tensor | None = None,
    prev_ids: torch.Tensor | None = None,
    mask_bits: torch.Tensor | None = None,
    reduction: str = "mean",
    vocab_size: int | None = None,
    bias_ids: torch.Tensor | None = None,
    bias_vals: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch version of :func:`fused_cross_entropy` (same arguments and result;
    materializes the fp32 ``[N, V]`` log-softmax and, with a sparse bias, the dense fp32
    ``[N, V]`` bias). Differentiable through torch autograd (logits and ``bias_vals``)."""
    v = logits.shape[1] if vocab_size is None else int(vocab_size)
    _check_ce_args(logits, targets, aux_targets, aux_weight, prev_ids, mask_bits, v)
    n = logits.shape[0]
    _check_bias_args(bias_ids, bias_vals, n)
    x = logits[:, :v].float()
    if bias_ids is not None:
        x = x + _dense_bias(bias_ids, bias_vals, v)
    allowed = None
    if mask_bits is not None:
        allowed = unpack_rows_torch(mask_bits[prev_ids.long()], v)
        x = x.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(x, dim=-1)
    t = targets.long()
    valid = t >= 0
    xt = x.gather(1, t.clamp_min(0)[:, None])[:, 0]
    zero = torch.zeros((), device=x.device)
    loss = torch.where(valid, lse - xt, zero)
    if aux_targets is not None:
        a = aux_targets.long()
        w = _aux_weight_tensor(aux_weight, n, x.device)
        xa = x.gather(1, a.clamp_min(0)[:, None])[:, 0]
        avalid = valid & (a >= 0) & (w != 0)
        if allowed is not None:  # an impossible auxiliary target is dropped, not infinite
            avalid = avalid & allowed.gather(1, a.clamp_min(0)[:, None])[:, 0]
        loss = loss + torch.where(avalid, w * (lse - xa), zero)
    return _reduce(loss, targets, reduction)


