"""Triton kernels against their torch references, through the Triton interpreter on CPU.

``TRITON_INTERPRET=1`` is read by ``tokenmill.train.kernels`` at call time, so this module sets
it per test with monkeypatch (no process-wide side effect on other test modules).
With ``TOKENMILL_KERNEL_DEVICE=cuda`` (benchmarks/gpu_check.sh) the same comparisons run on
CUDA tensors, i.e. the compiled kernels.
"""

import os

import numpy as np
import pytest
import torch

from tokenmill.tokenizers.legality import unpack_rows_torch
from tokenmill.train import kernels as K

DEV = torch.device(os.environ.get("TOKENMILL_KERNEL_DEVICE", "cpu"))
cpu_only = pytest.mark.skipif(DEV.type != "cpu", reason="CPU dispatch test")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ce_inputs(n, v, dtype=torch.float32, seed=0, legal_p=0.6):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g) * 3).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[n // 3] = -100  # an ignored position
    aux = torch.randint(-1, v, (n,), generator=g)
    w = torch.rand(n, generator=g)
    prev = torch.randint(0, v, (n,), generator=g)
    allowed = torch.rand(v, v, generator=g) < legal_p
    allowed[prev, targets.clamp_min(0)] = True  # real targets are always legal
    return tuple(t.to(DEV) for t in (logits, targets, aux, w, prev, allowed))


def _ce_kwargs(extra, aux, w, prev, allowed) -> dict:
    """fused_cross_entropy's optional arguments for an EXTRAS case."""
    kw = {}
    if "aux" in extra:
        kw.update(aux_targets=aux, aux_weight=w)
    if "mask" in extra:
        kw.update(prev_ids=prev, mask_bits=K.pack_mask_rows(allowed))
    return kw


CASES = [
    # (N, V, block_v): V not a multiple of the block, one partial block, single block
    (37, 300, 128),
    (5, 129, 64),
    (16, 1000, 256),
    (3, 50, None),
]
EXTRAS = ["plain", "aux", "mask", "aux+mask"]


@pytest.mark.parametrize("n,v,block_v", CASES)
@pytest.mark.parametrize("extra", EXTRAS)
def test_fused_cross_entropy_matches_reference_fp32(n, v, block_v, extra):
    logits, targets, aux, w, prev, allowed = _ce_inputs(n, v, seed=n * v)
    kw = _ce_kwargs(extra, aux, w, prev, allowed)
    x1 = logits.clone().requires_grad_()
    x2 = logits.clone().requires_grad_()
    l1 = K.fused_cross_entropy(x1, targets, reduction="none", block_v=block_v, **kw)
    assert "FusedCrossEntropy" in type(l1.grad_fn).__name__  # the kernel ran, not the fallback
    l2 = K.cross_entropy_reference(x2, targets, reduction="none", **kw)
    torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
    go = torch.randn(n, device=DEV)
    (g1,) = torch.autograd.grad(l1, x1, go)
    (g2,) = torch.autograd.grad(l2, x2, go)
    torch.testing.assert_close(g1, g2, atol=1e-5, rtol=1e-5)
    assert l1[n // 3] == 0 and torch.all(g1[n // 3] == 0)  # ignored position
    if "mask" in extra:
        bad = ~allowed[prev]
        assert torch.all(g1[bad] == 0)  # impossible tokens get no probability, no gradient


def test_fused_cross_entropy_matches_torch_f_cross_entropy():
    logits, targets, *_ = _ce_inputs(23, 517, seed=3)
    x1 = logits.clone().requires_grad_()
    x2 = logits.clone().requires_grad_()
    l1 = K.fused_cross_entropy(x1, targets, block_v=128)
    l2 = torch.nn.functional.cross_entropy(x2, targets, ignore_index=-100)
    torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-6, rtol=1e-5)


def test_fused_cross_entropy_bf16_and_strided_padded_vocab():
    n, v, vpad = 19, 333, 384
    logits, targets, aux, w, prev, allowed = _ce_inputs(n, v, seed=7)
    padded = torch.randn(n, vpad, device=DEV).to(torch.bfloat16)
    padded[:, :v] = logits.to(torch.bfloat16)
    bits = K.pack_mask_rows(allowed)
    xp1 = padded.clone().requires_grad_()
    xp2 = padded.clone().requires_grad_()
    kw = dict(aux_targets=aux, aux_weight=0.5, prev_ids=prev, mask_bits=bits)
    l1 = K.fused_cross_entropy(xp1[:, :v], targets, block_v=128, **kw)
    l2 = K.cross_entropy_reference(xp2[:, :v], targets, **kw)
    torch.testing.assert_close(l1, l2, atol=1e-4, rtol=1e-3)
    l1.backward()
    l2.backward()
    assert xp1.grad.dtype == torch.bfloat16
    torch.testing.assert_close(xp1.grad.float(), xp2.grad.float(), atol=1e-2, rtol=2e-2)
    assert torch.all(xp1.grad[:, v:] == 0)


def test_mask_only_renormalizes_and_never_raises_loss():
    logits, targets, _, _, prev, allowed = _ce_inputs(64, 200, seed=11)
    bits = K.pack_mask_rows(allowed)
    unmasked = K.fused_cross_entropy(logits, targets, reduction="none", block_v=64)
    masked = K.fused_cross_entropy(
        logits, targets, prev_ids=prev, mask_bits=bits, reduction="none", block_v=64
    )
    assert torch.all(masked <= unmasked + 1e-6)
    assert K.masked_target_count(targets, prev, bits) == 0
    # a target marked impossible: infinite loss, counted
    t2 = targets.clone()
    row = 5
    forbidden = torch.nonzero(~allowed[prev[row]])[0, 0]
    t2[row] = forbidden
    l = K.fused_cross_entropy(logits, t2, prev_ids=prev, mask_bits=bits, reduction="none",
                              block_v=64)
    others = torch.arange(64, device=DEV) != row
    assert torch.isinf(l[row]) and torch.isfinite(l[others]).all()
    assert K.masked_target_count(t2, prev, bits) == 1


@cpu_only
def test_pack_bits_follow_numpy_little_bitorder():
    allowed = torch.rand(9, 21) < 0.5
    bits = K.pack_mask_rows(allowed)
    ref = np.packbits(allowed.numpy(), axis=-1, bitorder="little")
    np.testing.assert_array_equal(bits.numpy(), ref)
    assert torch.equal(unpack_rows_torch(torch.from_numpy(ref), 21), allowed)
    # token 0 is bit value 1 of byte 0; token 9 is bit value 2 of byte 1
    one = torch.zeros(1, 16, dtype=torch.bool)
    one[0, 0] = one[0, 9] = True
    assert K.pack_mask_rows(one).tolist() == [[1, 2]]


@cpu_only
def test_cross_entropy_errors_name_the_argument():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="targets"):
        K.fused_cross_entropy(x, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="cover"):
        K.fused_cross_entropy(x, torch.zeros(4, dtype=torch.long),
                              prev_ids=torch.zeros(4, dtype=torch.long),
                              mask_bits=torch.zeros(10, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="together"):
        K.fused_cross_entropy(x, torch.zeros(4, dtype=torch.long),
                              mask_bits=torch.zeros(10, 2, dtype=torch.uint8))


@pytest.mark.parametrize("n,k,d,v,nb,bemb", [(37, 4, 40, 300, 7, True), (9, 1, 130, 50, 3, False),
                                             (20, 3, 64, 1000, 7, True)])
def test_lem_feature_matches_reference(n, k, d, v, nb, bemb):
    g = torch.Generator().manual_seed(n + k + d)
    cand = torch.randint(-1, v, (n, k), generator=g, dtype=torch.int32)
    cand[0] = -1  # a matched position without candidates: only the bucket embedding
    cand[1, :] = cand[1, 0].abs()  # duplicate candidates must accumulate
    buckets = torch.randint(-1, nb, (n,), generator=g, dtype=torch.int32)
    buckets[0] = 2
    buckets[2] = -1
    cand, buckets = cand.to(DEV), buckets.to(DEV)
    emb = torch.randn(v, d, generator=g).to(DEV)
    scale = torch.randn(nb, generator=g).to(DEV)
    be = torch.randn(nb, d, generator=g).to(DEV) if bemb else None
    p1 = [emb.clone().requires_grad_(), scale.clone().requires_grad_()]
    p2 = [emb.clone().requires_grad_(), scale.clone().requires_grad_()]
    if bemb:
        p1.append(be.clone().requires_grad_())
        p2.append(be.clone().requires_grad_())
    o1 = K.lem_feature(cand, buckets, *p1)
    assert "LEMFeature" in type(o1.grad_fn).__name__
    o2 = K.lem_feature_reference(cand, buckets, *p2)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    assert torch.all(o1[buckets < 0] == 0)
    go = torch.randn(n, d, generator=g).to(DEV)
    g1 = torch.autograd.grad(o1, p1, go)
    g2 = torch.autograd.grad(o2, p2, go)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert g1[1].abs().sum() > 0 and g1[0].abs().sum() > 0


@cpu_only
def test_torch_fallback_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(4, 10, requires_grad=True)
    t = torch.tensor([1, 2, 3, 4])
    assert K.backend_for(x) == "torch"
    l = K.fused_cross_entropy(x, t, reduction="none")
    assert "TorchCrossEntropy" in type(l.grad_fn).__name__
    torch.testing.assert_close(l.mean(), torch.nn.functional.cross_entropy(x, t))


@pytest.mark.parametrize("interpret", ["1", "0"])
@pytest.mark.parametrize("extra", EXTRAS)
def test_padded_vocab_both_backends(monkeypatch, interpret, extra):
    """Padded logits ``[N, V_pad]`` with ``vocab_size=V``: the Triton kernels (interpreted)
    and the lean CPU torch path both match the reference on the sliced logits, and the
    padding columns get a zero gradient."""
    if DEV.type != "cpu" and interpret == "0":
        pytest.skip("CPU torch path")
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    n, v, vpad = 21, 250, 256
    logits, targets, aux, w, prev, allowed = _ce_inputs(n, v, seed=5)
    padded = torch.randn(n, vpad, device=DEV)
    padded[:, :v] = logits
    kw = _ce_kwargs(extra, aux, w, prev, allowed)
    x1 = padded.clone().requires_grad_()
    x2 = padded.clone().requires_grad_()
    l1 = K.fused_cross_entropy(x1, targets, reduction="none", vocab_size=v, block_v=64, **kw)
    name = type(l1.grad_fn).__name__
    assert ("FusedCrossEntropy" if interpret == "1" else "TorchCrossEntropy") in name
    l2 = K.cross_entropy_reference(x2[:, :v], targets, reduction="none", **kw)
    torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
    go = torch.randn(n, device=DEV)
    (g1,) = torch.autograd.grad(l1, x1, go)
    (g2,) = torch.autograd.grad(l2, x2, go)
    torch.testing.assert_close(g1, g2, atol=1e-5, rtol=1e-5)
    assert torch.all(g1[:, v:] == 0)


def _bias_inputs(n, v, m, targets, aux, seed=0):
    """Sparse-bias ids ``int32 [n, m]`` and values ``float32 [n, m]``: -1 ids, duplicate ids
    in one row, ids equal to the target and to the auxiliary target."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, v, (n, m), generator=g, dtype=torch.int32)
    vals = torch.randn(n, m, generator=g) * 2
    ids[0, :] = -1  # no candidate at all
    ids[1, 1] = ids[1, 0] = 7  # duplicates add up
    ids[3, 0] = targets[3].clamp_min(0)
    ids[4, 1] = aux[4].clamp_min(0)
    ids[5, 2] = ids[5, 3] = targets[5].clamp_min(0)
    return ids.to(DEV), vals.to(DEV)


@pytest.mark.parametrize("backend", ["interpret", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extra", EXTRAS)
def test_sparse_bias_matches_reference(monkeypatch, backend, dtype, extra):
    """``softmax(z + b)`` with the sparse bias (M candidates per row, -1 ignored,
    duplicates summed) equals the dense reference, loss and both gradients (logits and
    bias values), in fp32 and bf16, with and without prefix target and mask, at V = 300
    (not a power of two, two partial chunks), on the Triton kernels (interpreted) and the
    CPU torch path."""
    if DEV.type != "cpu" and backend == "torch":
        pytest.skip("CPU torch path")
    monkeypatch.setenv("TRITON_INTERPRET", "1" if backend == "interpret" else "0")
    n, v, m = 7, 300, 4
    logits, targets, aux, w, prev, allowed = _ce_inputs(n, v, dtype, seed=21)
    ids, vals = _bias_inputs(n, v, m, targets, aux)
    allowed[prev[1], 7] = True  # the duplicated candidate is possible (non-zero gradient)
    kw = _ce_kwargs(extra, aux, w, prev, allowed)
    x1, x2 = (logits.clone().requires_grad_() for _ in range(2))
    b1, b2 = (vals.clone().requires_grad_() for _ in range(2))
    l1 = K.fused_cross_entropy(x1, targets, reduction="none", block_v=128, bias_ids=ids,
                               bias_vals=b1, **kw)
    name = type(l1.grad_fn).__name__
    assert ("FusedCrossEntropy" if backend == "interpret" else "TorchCrossEntropy") in name
    l2 = K.cross_entropy_reference(x2, targets, reduction="none", bias_ids=ids, bias_vals=b2,
                                   **kw)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(l1, l2, **tol)
    go = torch.rand(n, device=DEV) + 0.5
    gx1, gb1 = torch.autograd.grad(l1, (x1, b1), go)
    gx2, gb2 = torch.autograd.grad(l2, (x2, b2), go)
    gtol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=2e-2)
    torch.testing.assert_close(gx1.float(), gx2.float(), **gtol)
    torch.testing.assert_close(gb1, gb2, atol=1e-5, rtol=1e-5)  # fp32 in both
    assert gb1.dtype == torch.float32 and torch.all(gb1[0] == 0)  # -1 ids: no gradient
    assert torch.all(gb1[n // 3] == 0)  # an ignored target: no gradient
    assert gb1[1, 0] == gb1[1, 1] != 0  # duplicates: both get dL/dz' of their column
    # the bias changes the loss: without it the result differs where a candidate exists
    plain = K.cross_entropy_reference(logits, targets, reduction="none", **kw)
    assert not torch.allclose(plain, l2.detach())


def test_sparse_bias_padded_vocab_and_zero_bias():
    """Ids in the padding columns ``[V, V_pad)`` are ignored (no effect, zero gradient), and
    an all-zero bias gives exactly the unbiased loss."""
    n, v, vpad, m = 9, 250, 256, 3
    logits, targets, *_ = _ce_inputs(n, v, seed=4)
    padded = torch.randn(n, vpad, device=DEV)
    padded[:, :v] = logits
    ids = torch.full((n, m), 252, dtype=torch.int32, device=DEV)  # padding columns only
    vals = torch.randn(n, m, device=DEV, requires_grad=True)
    l1 = K.fused_cross_entropy(padded, targets, reduction="none", vocab_size=v, block_v=64,
                               bias_ids=ids, bias_vals=vals)
    l0 = K.fused_cross_entropy(padded, targets, reduction="none", vocab_size=v, block_v=64)
    torch.testing.assert_close(l1, l0, atol=0, rtol=0)
    (gb,) = torch.autograd.grad(l1.sum(), vals)
    assert torch.all(gb == 0)
    ids = torch.randint(-1, v, (n, m), dtype=torch.int32, device=DEV)
    lz = K.fused_cross_entropy(padded, targets, reduction="none", vocab_size=v, block_v=64,
                               bias_ids=ids, bias_vals=torch.zeros(n, m, device=DEV))
    assert torch.equal(lz, l0)
    with pytest.raises(ValueError, match="bias_vals"):
        K.fused_cross_entropy(padded, targets, vocab_size=v, bias_ids=ids)
