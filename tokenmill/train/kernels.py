"""Triton kernels for the trainer, each with the plain torch reference it must match.

Two kernels, each wrapped in a ``torch.autograd.Function``:

* :func:`fused_cross_entropy`: cross-entropy forward and backward over the vocabulary in
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

* :func:`lem_feature`: the longest-exact-match (LEM) side input: for each position the mean of
  the embedding rows of its candidate next tokens, times a learned per-bucket scale, plus a
  learned per-bucket embedding; zero where there is no match. Backward scatters gradients to
  the embedding table, the scales and the bucket embeddings with atomic adds.

Dispatch: CUDA tensors run the compiled Triton kernels; CPU tensors run the same kernels
through the Triton interpreter when the environment variable ``TRITON_INTERPRET=1`` is set
(read at call time, so tests may set it in-process); otherwise CPU tensors use plain torch:
the same maths as a lean autograd Function for the cross-entropy (one in-place backward
pass, tested against the reference) and :func:`lem_feature_reference` for the gather. The
interpreter is slow: it is for tests, not for CPU training. The ``*_reference`` functions
are the straightforward autograd versions the kernels are checked against.

Legality mask bit order
-----------------------
``mask_bits`` is ``uint8 [V_rows, ceil(V / 8)]``; bit ``j`` of row ``r`` is 1 when token ``j``
may follow previous token ``r``. Bits are **LSB-first within each byte**: token ``j`` is bit
``j % 8`` (value ``1 << (j % 8)``) of byte ``j // 8``, exactly what
``numpy.packbits(allowed, axis=-1, bitorder="little")`` produces. :func:`pack_mask_rows` and
:func:`unpack_mask_rows` convert.
"""

import os

import torch
import triton
import triton.language as tl

__all__ = [
    "fused_cross_entropy",
    "cross_entropy_reference",
    "lem_feature",
    "lem_feature_reference",
    "pack_mask_rows",
    "unpack_mask_rows",
    "masked_target_count",
    "backend_for",
]

# ----------------------------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------------------------


def backend_for(t: torch.Tensor) -> str:
    """Which implementation a call on tensor ``t`` uses: ``"triton"``, ``"interpret"`` or
    ``"torch"``. ``TRITON_INTERPRET=1`` is read at call time."""
    if t.is_cuda:
        return "triton"
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "interpret"
    return "torch"


_KERNELS: dict[tuple[str, str], object] = {}


class _Interpreted:
    """An interpreted kernel that also works when triton was imported without
    ``TRITON_INTERPRET=1``: triton's own jitted helpers (``tl.max``, ``tl.sum``,
    ``tl.zeros``) were then built as compiled-only functions, so they are swapped for
    interpreted twins during the launch and restored after (not thread-safe)."""

    _HELPERS = ("max", "sum", "zeros")

    def __init__(self, fn):
        from triton.runtime.interpreter import InterpretedFunction

        self._fn = InterpretedFunction(fn)
        self._twins = {}
        for name in self._HELPERS:
            member = getattr(tl, name)
            if not isinstance(member, InterpretedFunction) and hasattr(member, "fn"):
                self._twins[name] = (member, InterpretedFunction(member.fn))

    def __getitem__(self, grid):
        launch = self._fn[grid]

        def run(*args, **kwargs):
            for name, (_, twin) in self._twins.items():
                setattr(tl, name, twin)
            try:
                return launch(*args, **kwargs)
            finally:
                for name, (orig, _) in self._twins.items():
                    setattr(tl, name, orig)

        return run


def _kernel(fn, backend: str):
    """The jitted (compiled) or interpreted version of the raw kernel function ``fn``.

    Kernels are plain functions decorated on first use, so one process can run the compiled
    kernel on CUDA tensors and the interpreter on CPU tensors.
    """
    key = (fn.__name__, backend)
    k = _KERNELS.get(key)
    if k is None:
        if backend == "interpret":
            k = _Interpreted(fn)
        else:
            k = triton.jit(fn)
        _KERNELS[key] = k
    return k


# ----------------------------------------------------------------------------------------------
# legality mask helpers
# ----------------------------------------------------------------------------------------------


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


def unpack_mask_rows(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack ``uint8 [..., ceil(V/8)]`` LSB-first rows into ``bool [..., vocab_size]``."""
    if bits.dtype != torch.uint8:
        raise TypeError(f"mask bits must be uint8, got {bits.dtype}")
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    b = (bits.unsqueeze(-1) >> shifts) & 1
    return b.flatten(-2)[..., :vocab_size].bool()


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
            k = _kernel(_ce_fwd_kernel, backend)
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
            k = _kernel(_ce_bwd_kernel, backend)
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
            allowed = unpack_mask_rows(mask_bits[prev_ids.long()], v)
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
        allowed = unpack_mask_rows(mask_bits[prev_ids.long()], v)
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
            _kernel(_lem_fwd_kernel, backend)[(n, triton.cdiv(d, bd))](
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
            _kernel(_lem_bwd_kernel, backend)[(n, triton.cdiv(d, bd))](
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
