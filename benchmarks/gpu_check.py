"""The GPU check of tokenmill's trainer (run by ``benchmarks/gpu_check.sh``), and its CPU part.

Parts, in order; the first failing check stops the run with one ``GPU CHECK FAILED`` line,
then the summary table of every check so far is printed (exit 1):

1. **kernels**: the kernel objects are compiled ``triton.runtime.jit.JITFunction`` (not the
   interpreter); fused cross-entropy forward and backward against the fp32 torch reference
   (``cross_entropy_reference`` on the same logits upcast) for fp32 and bf16 logits and every
   variant (plain, prefix target, legality mask, both, sparse n-gram bias, all three) at
   N x V = 4,096 x 50,257 (padded to 50,304 columns), and on > 2**31 logit elements (rows past
   the 2**31 offset compared); with the sparse bias (M = 8 ids per row, -1 and duplicate ids
   included) also the gradient of the bias values; the LEM gather forward and backward at
   N = 16,384, K = 4, D = 768; the whole GPT-2 small model's (LEM, n-gram input and bias,
   prefix target, mask) loss and every parameter gradient, kernels against references (fp32
   with TF32 off, and bf16 autocast).
2. **speed**: ``triton.testing.do_bench`` (ms, fwd+bwd) of the fused cross-entropy against
   ``F.cross_entropy`` eager and ``torch.compile``d, and of the LEM kernel against its
   reference; the losses must agree.
3. **training**: ``tokenmill train`` (the CLI, one process per run) on the quickstart shards,
   GPT-2 small, 16 x 1024, ~300 steps: a baseline, and a run with every side input (prefix
   target, LEM, the n-gram side channel made first with ``tokenmill ngram features`` for the
   train and val splits, legality-masked validation), that one also stopped halfway and
   resumed. A curation manifest given as ``--data`` is first planned into a training mix
   (every source at its mixture weight, one pass), since side channels bind to a mix. Asserts
   finite losses, a falling loss, 0 masked targets, masked <= unmasked val loss, an LEM wait
   under 10% of step time, and the resumed final val loss within tolerance of the
   uninterrupted one; prints tokens/s and MFU.

``--cpu-toy`` runs the same checks at toy sizes on CPU, the kernels through the Triton
interpreter (``TRITON_INTERPRET=1``; the kernel objects must then be interpreted ones),
``do_bench`` replaced by a wall-clock median and ``torch.compile`` skipped, training on the
CPU torch path: this is what ``tests/train/test_gpu_check.py`` runs.

Tolerances (``|a - b| <= atol + rtol * |b|`` elementwise, b = fp32 reference): see ``TOL``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]

# (atol, rtol) per compared quantity
TOL = {
    ("ce_loss", torch.float32): (1e-4, 1e-5),
    ("ce_grad", torch.float32): (1e-6, 1e-4),
    ("ce_loss", torch.bfloat16): (1e-3, 1e-4),  # fp32 accumulation of bf16 logits
    ("ce_grad", torch.bfloat16): (1e-5, 1.6e-2),  # gradient rounded to bf16 (2**-8 relative)
    # dL/d(bias value): fp32 in kernel and reference, from the same (upcast) logits
    ("ce_bias_grad", torch.float32): (1e-6, 1e-4),
    ("ce_bias_grad", torch.bfloat16): (1e-6, 1e-4),
    ("lem_out", torch.float32): (1e-5, 1e-5),
    ("lem_grad", torch.float32): (1e-4, 1e-4),  # fp32 atomic adds in any order
}
# whole model: |loss diff| <= MODEL_LOSS_TOL * max(1, |loss|); per parameter
# max|g_kernel - g_ref| <= MODEL_GRAD_TOL * max|g_ref|
MODEL_LOSS_TOL = {"fp32": 1e-5, "bf16-autocast": 2e-3}
MODEL_GRAD_TOL = {"fp32": 1e-3, "bf16-autocast": 5e-2}
RESUME_TOL = {"gpu": 0.03, "cpu": 1e-5}  # final val loss, resumed vs uninterrupted (nats)
LEM_WAIT_MAX = 0.10  # LEM wait / step time
NGRAM_M = 8  # n-gram candidates per position (sparse bias ids per row)
CE_VARIANTS = ("plain", "prefix", "mask", "prefix+mask", "ngram", "prefix+mask+ngram")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one mode."""

    ce_n: int
    vocab: int
    big: bool  # the > 2**31 element case
    lem: tuple[int, int, int, int]  # N, K, D, V
    model: tuple[str, int, int]  # preset, batch, seq
    bench_n: int  # rows of the timed CE (and, capped at it, of the timed LEM gather)
    train: dict
    block_v: int | None = None  # CE vocabulary chunk (None: the kernel's default)


GPU = Sizes(ce_n=4096, vocab=50257, big=True, lem=(16384, 4, 768, 50304),
            model=("gpt2-small", 4, 1024), bench_n=16384,
            train=dict(model="gpt2-small", seq_len=1024, batch_size=16, steps=300, lr=1.5e-3,
                       warmup_steps=20, weight_decay=0.1, val_every=50, val_tokens=65536))
CPU_TOY = Sizes(ce_n=8, vocab=1000, big=False, lem=(32, 4, 48, 1000),
                model=("tiny", 1, 16), bench_n=16,
                train=dict(model="tiny", seq_len=32, batch_size=4, steps=8, lr=5e-3,
                           warmup_steps=2, val_every=4, val_tokens=512, num_threads=1,
                           model_overrides={"n_layer": 1, "n_embd": 64, "n_head": 2}),
                block_v=512)


class CheckFailed(AssertionError):
    """A check that did not hold; its message is the one line printed."""


ROWS: list[tuple[str, str, str, str, str]] = []


def check(part: str, what: str, value: float | str, limit: str, ok: bool) -> None:
    """Record one check in the summary; raise :class:`CheckFailed` if it does not hold."""
    shown = f"{value:.3g}" if isinstance(value, float) else str(value)
    ROWS.append((part, what, shown, limit, "ok" if ok else "FAIL"))
    print(f"  {'ok  ' if ok else 'FAIL'} {part}: {what} = {shown} ({limit})", flush=True)
    if not ok:
        raise CheckFailed(f"{part}: {what} = {shown}, needs {limit}")


def info(part: str, what: str, value: str) -> None:
    """A measurement with no limit (speed), shown in the summary."""
    ROWS.append((part, what, value, "-", "info"))
    print(f"  info {part}: {what} = {value}", flush=True)


def close(part: str, what: str, a: torch.Tensor, b: torch.Tensor, atol: float,
          rtol: float) -> None:
    """Check ``|a - b| <= atol + rtol * |b|`` elementwise (``b`` the reference)."""
    a, b = a.detach().float(), b.detach().float()
    finite = bool(torch.isfinite(a).all() and torch.isfinite(b).all())
    err = (a - b).abs()
    excess = float((err - rtol * b.abs()).max()) if err.numel() else 0.0
    check(part, what, float(err.max()) if err.numel() else 0.0,
          f"max|err| - {rtol:g}|ref| <= {atol:g}", finite and excess <= atol)


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


def random_mask_bits(v: int, prev: torch.Tensor, targets: torch.Tensor,
                     gen: torch.Generator) -> torch.Tensor:
    """Random packed legality rows ``uint8 [v, ceil(v/8)]`` (about half the pairs allowed)
    in which every (prev, target) pair given is allowed."""
    from tokenmill.train.kernels import masked_target_count

    dev = prev.device
    bits = torch.randint(0, 256, (v, (v + 7) // 8), generator=gen, device=dev,
                         dtype=torch.int32).to(torch.uint8)
    t = targets.clamp_min(0).long()
    for _ in range(64):  # duplicate (row, byte) pairs in one |= keep only one bit: repeat
        bits[prev.long(), t >> 3] |= (1 << (t & 7)).to(torch.uint8)
        if masked_target_count(targets, prev, bits) == 0:
            return bits
    raise RuntimeError("could not allow every (prev, target) pair")


def check_kernel_objects(gpu: bool) -> None:
    """Run each kernel once, then check what the kernel objects are: compiled
    ``JITFunction`` on GPU, interpreted on CPU."""
    from tokenmill.train import kernels as K

    dev = "cuda" if gpu else "cpu"
    interp = os.environ.get("TRITON_INTERPRET", "0")
    check("kernels", "TRITON_INTERPRET", interp, "0/unset on GPU, 1 on CPU",
          (interp != "1") if gpu else (interp == "1"))
    x = torch.randn(4, 130, device=dev, requires_grad=True)
    K.fused_cross_entropy(x, torch.arange(4, device=dev), block_v=64,
                          bias_ids=torch.randint(-1, 130, (4, 3), device=dev),
                          bias_vals=torch.randn(4, 3, device=dev)).backward()
    e = torch.randn(10, 8, device=dev, requires_grad=True)
    K.lem_feature(torch.randint(-1, 10, (5, 2), device=dev), torch.zeros(5, device=dev,
                  dtype=torch.long), e, torch.ones(3, device=dev)).sum().backward()
    backend = K.backend_for(x)
    check("kernels", "backend", backend, "triton on GPU, interpret on CPU",
          backend == ("triton" if gpu else "interpret"))
    from tokenmill.train.kernels.dispatch import KERNELS

    objs = {name: k for (name, b), k in KERNELS.items() if b == backend}  # decorated kernels
    want = {"_ce_fwd_kernel", "_ce_bwd_kernel", "_lem_fwd_kernel", "_lem_bwd_kernel"}
    if gpu:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        kinds = {n: type(k).__name__ for n, k in objs.items()
                 if isinstance(k, JITFunction) and not isinstance(k, InterpretedFunction)}
    else:
        kinds = {n: type(k).__name__ for n, k in objs.items() if hasattr(k, "_fn")}
    check("kernels", "kernel objects", f"{len(kinds)} of {len(want)} "
          f"{'/'.join(sorted(set(kinds.values())))}",
          "all 4 JITFunction" if gpu else "all 4 interpreted", set(kinds) == want)


def ce_inputs(n: int, v: int, vpad: int, dtype: torch.dtype, dev: str, seed: int,
              mask: bool) -> dict:
    """Random fused-CE inputs: logits ``[n, vpad]`` (``dtype``), targets with ignored rows,
    prefix targets and weights, previous ids, (``mask``) legality rows, and a sparse bias of
    ``NGRAM_M`` ids per row (some -1, some duplicated, some the target) with values."""
    g = torch.Generator(device=dev).manual_seed(seed)
    d = dict(logits=(torch.randn(n, vpad, generator=g, device=dev, dtype=dtype) * 3),
             targets=torch.randint(0, v, (n,), generator=g, device=dev),
             aux=torch.randint(-1, v, (n,), generator=g, device=dev),
             w=torch.rand(n, generator=g, device=dev),
             prev=torch.randint(0, v, (n,), generator=g, device=dev))
    d["targets"][:: 97] = -100
    ids = torch.randint(-1, v, (n, NGRAM_M), generator=g, device=dev, dtype=torch.int32)
    ids[1::5, 1] = ids[1::5, 0]  # duplicate ids add up
    ids[2::5, 2] = d["targets"][2::5].clamp_min(0).to(torch.int32)  # the target itself
    d["bias_ids"], d["bias_vals"] = ids, torch.randn(n, NGRAM_M, generator=g, device=dev) * 2
    d["bits"] = random_mask_bits(v, d["prev"], d["targets"], g) if mask else None
    return d


def ce_kwargs(variant: str, d: dict) -> dict:
    kw = {}
    if "prefix" in variant:
        kw.update(aux_targets=d["aux"], aux_weight=d["w"])
    if "mask" in variant:
        kw.update(prev_ids=d["prev"], mask_bits=d["bits"])
    if "ngram" in variant:
        kw.update(bias_ids=d["bias_ids"], bias_vals=d["bias_vals"])
    return kw


def ce_compare(part: str, d: dict, v: int, variant: str, rows: torch.Tensor | None,
               block_v: int | None = None) -> None:
    """Fused CE forward + backward on all of ``d['logits']`` against the fp32 reference (on
    ``rows`` only, if given); padding columns must get a zero gradient."""
    from tokenmill.train.kernels import cross_entropy_reference, fused_cross_entropy

    dtype = d["logits"].dtype
    bias = "ngram" in variant
    kw = ce_kwargs(variant, d)
    x1 = d["logits"].detach().requires_grad_()
    if bias:
        kw["bias_vals"] = kw["bias_vals"].detach().requires_grad_()
    l1 = fused_cross_entropy(x1, d["targets"], reduction="none", vocab_size=v,
                             block_v=block_v, **kw)
    if "FusedCrossEntropy" not in type(l1.grad_fn).__name__:
        check(part, "autograd node", type(l1.grad_fn).__name__, "the fused kernel", False)
    go = torch.rand_like(l1) + 0.5
    g1, *gb1 = torch.autograd.grad(l1, [x1, kw["bias_vals"]] if bias else [x1], go)
    sel = slice(None) if rows is None else rows
    sub = {k: (t[sel] if isinstance(t, torch.Tensor) and k != "bits" else t)
           for k, t in d.items()}
    x2 = d["logits"][sel].float().requires_grad_()
    kw2 = ce_kwargs(variant, sub)
    if bias:
        kw2["bias_vals"] = kw2["bias_vals"].detach().requires_grad_()
    l2 = cross_entropy_reference(x2, sub["targets"], reduction="none", vocab_size=v, **kw2)
    g2, *gb2 = torch.autograd.grad(l2, [x2, kw2["bias_vals"]] if bias else [x2], go[sel])
    close(part, f"{variant} {str(dtype)[6:]} loss", l1[sel], l2, *TOL[("ce_loss", dtype)])
    close(part, f"{variant} {str(dtype)[6:]} grad", g1[sel], g2, *TOL[("ce_grad", dtype)])
    if bias:
        close(part, f"{variant} {str(dtype)[6:]} bias-value grad", gb1[0][sel], gb2[0],
              *TOL[("ce_bias_grad", dtype)])
    check(part, f"{variant} {str(dtype)[6:]} padding grad", float(g1[:, v:].abs().max())
          if g1.shape[1] > v else 0.0, "== 0", g1.shape[1] == v or bool((g1[:, v:] == 0).all()))


def check_cross_entropy(sz: Sizes, gpu: bool) -> None:
    """Every variant in fp32 and bf16 at ``ce_n x vocab``; on GPU also > 2**31 elements."""
    dev = "cuda" if gpu else "cpu"
    v = sz.vocab
    vpad = (v + 127) // 128 * 128
    part = f"CE {sz.ce_n}x{v}"
    for dtype in (torch.float32, torch.bfloat16):
        d = ce_inputs(sz.ce_n, v, vpad, dtype, dev, seed=1, mask=True)
        for variant in CE_VARIANTS:
            ce_compare(part, d, v, variant, None, sz.block_v)
        del d
    if not sz.big:
        info("CE > 2**31", "large case", "skipped on CPU (needs 2 x 4.3 GB)")
        return
    n = (2**31) // vpad + 257
    part = f"CE {n}x{v} ({n * vpad / 2**31:.3f} x 2**31 el.)"
    d = ce_inputs(n, v, vpad, torch.bfloat16, dev, seed=2, mask=True)
    rows = torch.cat([torch.arange(64), torch.arange(n - 256, n)]).to(dev)  # last rows > 2**31
    for variant in ("plain", "prefix+mask+ngram"):
        ce_compare(part, d, v, variant, rows)
        torch.cuda.empty_cache()
    del d
    torch.cuda.empty_cache()


def check_lem(sz: Sizes, gpu: bool) -> None:
    """LEM gather forward and backward (fp32 table) against the reference."""
    from tokenmill.train.kernels import lem_feature, lem_feature_reference

    dev = "cuda" if gpu else "cpu"
    n, k, d, v = sz.lem
    nb = 7
    g = torch.Generator(device=dev).manual_seed(3)
    cand = torch.randint(-1, v, (n, k), generator=g, device=dev, dtype=torch.int32)
    cand[: n // 50] = cand[: n // 50, :1].abs()  # duplicate candidates accumulate
    buckets = torch.randint(-1, nb, (n,), generator=g, device=dev, dtype=torch.int32)
    base = [torch.randn(v, d, generator=g, device=dev), torch.randn(nb, generator=g, device=dev),
            torch.randn(nb, d, generator=g, device=dev)]
    p1 = [t.clone().requires_grad_() for t in base]
    p2 = [t.clone().requires_grad_() for t in base]
    o1 = lem_feature(cand, buckets, *p1)
    o2 = lem_feature_reference(cand, buckets, *p2)
    part = f"LEM {n}x{k}x{d}"
    check(part, "autograd node", type(o1.grad_fn).__name__, "the kernel",
          "LEMFeature" in type(o1.grad_fn).__name__)
    close(part, "forward", o1, o2, *TOL[("lem_out", torch.float32)])
    go = torch.randn(n, d, generator=g, device=dev)
    for name, a, b in zip(("grad embedding", "grad scale", "grad bucket_emb"),
                          torch.autograd.grad(o1, p1, go), torch.autograd.grad(o2, p2, go),
                          strict=True):
        close(part, name, a, b, *TOL[("lem_grad", torch.float32)])


def _model_pass(net, batch: dict, ce: Callable, lem: Callable, autocast: bool, dev: str):
    """Loss and every parameter gradient of ``net`` with the given CE and LEM functions."""
    from tokenmill.train import model as M

    saved = M.fused_cross_entropy, M.lem_feature
    M.fused_cross_entropy, M.lem_feature = ce, lem  # the model's module-level names
    try:
        net.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
            loss = net(**batch)
        loss.backward()
    finally:
        M.fused_cross_entropy, M.lem_feature = saved
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in net.named_parameters()}


def check_model(sz: Sizes, gpu: bool) -> None:
    """The whole model (LEM, n-gram input and sparse bias, prefix target, legality mask on)
    with kernels vs references."""
    from tokenmill.train import kernels as K
    from tokenmill.train.model import GPT, GPTConfig

    dev = "cuda" if gpu else "cpu"
    preset, b, t = sz.model
    v = sz.vocab
    torch.manual_seed(4)
    net = GPT(GPTConfig.preset(preset, vocab_size=v, max_seq_len=t, lem=True, ngram=True,
                               ngram_m=NGRAM_M)).to(dev)
    with torch.no_grad():  # not the zero init: every gradient should be non-zero
        for p in net.parameters():
            p.normal_(0.0, 0.02 if p.dim() > 1 else 0.5)
    g = torch.Generator(device=dev).manual_seed(5)
    idx = torch.randint(0, v, (b, t), generator=g, device=dev)
    tgt = torch.randint(0, v, (b, t), generator=g, device=dev)
    tgt[0, :3] = -100
    batch = dict(idx=idx, targets=tgt, aux_weight=0.3,
                 lem_len=torch.randint(0, 300, (b, t), generator=g, device=dev),
                 lem_cand=torch.randint(-1, v, (b, t, 4), generator=g, device=dev),
                 aux_targets=torch.randint(-1, v, (b, t), generator=g, device=dev),
                 mask_bits=random_mask_bits(v, idx.reshape(-1), tgt.reshape(-1), g),
                 ngram_cand=torch.randint(-1, v, (b, t, NGRAM_M), generator=g, device=dev),
                 ngram_logp=-5 * torch.rand(b, t, NGRAM_M, generator=g, device=dev))
    modes = [("fp32", False)] + ([("bf16-autocast", True)] if gpu else [])
    for mode, ac in modes:
        part = f"model {preset} {b}x{t} {mode}"
        l1, g1 = _model_pass(net, batch, K.fused_cross_entropy, K.lem_feature, ac, dev)
        l2, g2 = _model_pass(net, batch, K.cross_entropy_reference, K.lem_feature_reference,
                             ac, dev)
        check(part, "loss |kernel - ref|", abs(l1 - l2),
              f"<= {MODEL_LOSS_TOL[mode]:g} x max(1, loss)",
              math.isfinite(l1) and abs(l1 - l2) <= MODEL_LOSS_TOL[mode] * max(1.0, abs(l2)))
        worst, worst_name, dead = 0.0, "", []
        for name, ref in g2.items():
            scale = float(ref.abs().max())
            if scale == 0 or not torch.isfinite(g1[name]).all():
                dead.append(name)
                continue
            rel = float((g1[name].float() - ref.float()).abs().max()) / scale
            if rel >= worst:
                worst, worst_name = rel, name
        check(part, f"{len(g2)} params: zero/non-finite grads", ", ".join(dead) or "none",
              "none", not dead)
        check(part, f"worst param grad max|diff|/max|ref| ({worst_name})", worst,
              f"<= {MODEL_GRAD_TOL[mode]:g}", worst <= MODEL_GRAD_TOL[mode])


# ----------------------------------------------------------------------------------------------
# speed
# ----------------------------------------------------------------------------------------------


def _bench(fn: Callable[[], None], gpu: bool, grad: list[torch.Tensor]) -> float:
    """Milliseconds per call: ``triton.testing.do_bench`` on GPU, a wall-clock median of 3 on
    CPU."""
    if gpu:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=200, grad_to_none=grad))
    fn()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        for t in grad:
            t.grad = None
    return 1e3 * statistics.median(ts)


def _peak_mib(fn: Callable[[], None], gpu: bool) -> str:
    if not gpu:
        return "-"
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    m0 = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return f"{(torch.cuda.max_memory_allocated() - m0) / 2**20:.0f} MiB"


def bench_cross_entropy(sz: Sizes, gpu: bool) -> None:
    """Fused CE vs F.cross_entropy (eager bf16, eager fp32 upcast, compiled fp32 upcast)."""
    from tokenmill.train.kernels import fused_cross_entropy

    dev = "cuda" if gpu else "cpu"
    n, v = sz.bench_n, sz.vocab
    vpad = (v + 127) // 128 * 128
    g = torch.Generator(device=dev).manual_seed(6)
    x = (torch.randn(n, vpad, generator=g, device=dev) * 2).to(torch.bfloat16).requires_grad_()
    tgt = torch.randint(0, v, (n,), generator=g, device=dev)
    fns = {"tokenmill fused": lambda: fused_cross_entropy(x, tgt, vocab_size=v),
           "F.cross_entropy eager bf16": lambda: F.cross_entropy(x[:, :v], tgt),
           "F.cross_entropy eager fp32": lambda: F.cross_entropy(x[:, :v].float(), tgt)}
    if gpu:
        compiled = torch.compile(lambda a, b: F.cross_entropy(a[:, :v].float(), b))
        fns["F.cross_entropy compiled fp32"] = lambda: compiled(x, tgt)
    else:
        info("speed CE", "torch.compile", "skipped on CPU")
    losses, times = {}, {}
    for name, f in fns.items():
        losses[name] = float(f().detach())  # also compiles
        times[name] = _bench(lambda f=f: f().backward(), gpu, [x])
        mem = _peak_mib(lambda f=f: f().backward(), gpu)
        x.grad = None
        info(f"speed CE {n}x{v} bf16", name, f"{times[name]:.3f} ms fwd+bwd, peak +{mem}")
    ref = losses["F.cross_entropy eager fp32"]  # the bf16 eager loss is rounded to bf16
    diff = max(abs(loss - ref) for name, loss in losses.items() if "bf16" not in name)
    check(f"speed CE {n}x{v} bf16", "fp32-accumulated losses agree (max |diff|)", diff,
          "<= 1e-3", diff <= 1e-3)
    for name in fns:
        if name != "tokenmill fused":
            info(f"speed CE {n}x{v} bf16", f"fused speed-up vs {name}",
                 f"{times[name] / times['tokenmill fused']:.2f}x")


def bench_lem(sz: Sizes, gpu: bool) -> None:
    """LEM kernel vs its reference, forward + backward."""
    from tokenmill.train.kernels import lem_feature, lem_feature_reference

    dev = "cuda" if gpu else "cpu"
    n, k, d, v = sz.lem
    n = min(n, sz.bench_n)
    g = torch.Generator(device=dev).manual_seed(7)
    cand = torch.randint(-1, v, (n, k), generator=g, device=dev, dtype=torch.int32)
    buckets = torch.randint(-1, 7, (n,), generator=g, device=dev, dtype=torch.int32)
    ps = [torch.randn(v, d, generator=g, device=dev).requires_grad_(),
          torch.randn(7, generator=g, device=dev).requires_grad_(),
          torch.randn(7, d, generator=g, device=dev).requires_grad_()]
    times = {}
    for name, f in (("kernel", lem_feature), ("reference", lem_feature_reference)):
        times[name] = _bench(lambda f=f: f(cand, buckets, *ps).sum().backward(), gpu, ps)
        info(f"speed LEM {n}x{k}x{d}", name, f"{times[name]:.3f} ms fwd+bwd")
    info(f"speed LEM {n}x{k}x{d}", "kernel speed-up",
         f"{times['reference'] / times['kernel']:.2f}x")


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------


def toy_legality(cfg: dict, path: Path) -> Path:
    """A cheap sound-on-this-data gpt2 table for the CPU toy (the analytic build takes
    ~15 s even for a few rows): each previous token of the validation inputs may be followed
    only by the tokens that follow it there; every other row allows everything. Saved with
    tokenmill's header (1 = possible), so loading reads the polarity as for a real table."""
    import numpy as np

    from tokenmill.tokenizers import identity
    from tokenmill.tokenizers.legality import LegalityTable
    from tokenmill.train.batches import open_data
    from tokenmill.train.config import TrainConfig

    train_cfg = TrainConfig(**cfg)
    val = open_data(train_cfg).validation_rows(train_cfg.val_tokens).numpy()
    ident = identity("gpt2")
    v = ident.n_vocab
    bits = np.full((v, (v + 7) // 8), 0xFF, dtype=np.uint8)
    bits[:, -1] = np.uint8((1 << (v % 8)) - 1) if v % 8 else 0xFF
    prev, nxt = val[:, :-1].reshape(-1), val[:, 1:].reshape(-1)
    bits[np.unique(prev)] = 0
    np.bitwise_or.at(bits, (prev, nxt >> 3), (1 << (nxt & 7)).astype(np.uint8))
    return LegalityTable(ident, bits, {"toy": "cpu-toy table from the val pairs"}).save(path)


def train_cli(cfg: dict, out: Path, extra: list[str], gpu: bool) -> dict:
    """``tokenmill train`` on ``cfg`` into ``out`` (a separate process on GPU: the checking
    process has initialised CUDA and the LEM predictor forks; in-process on the CPU toy);
    returns its ``metrics.json``."""
    if "--resume" not in extra:  # a fresh run: nothing of an earlier check run
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out.with_suffix(".json")
    cfg_path.write_text(json.dumps({**cfg, "out_dir": str(out)}, indent=1))
    argv = ["train", str(cfg_path), "-q", *extra]
    print(f"  $ tokenmill {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    if gpu:
        env = {k: x for k, x in os.environ.items() if k != "TRITON_INTERPRET"}
        rc = subprocess.run([sys.executable, "-m", "tokenmill.cli", *argv], env=env).returncode
    else:
        from tokenmill.cli import main

        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "0"  # train on the CPU torch path, not interpreted
        try:
            rc = main(argv)
        finally:
            os.environ["TRITON_INTERPRET"] = old if old is not None else "0"
    check("train", f"tokenmill train {' '.join(argv[3:])} ({out.name}): exit status", rc,
          "== 0", rc == 0)
    info("train", f"tokenmill train {' '.join(argv[3:])} ({out.name}): wall time",
         f"{time.perf_counter() - t0:.1f} s")
    metrics = json.loads((out / "metrics.json").read_text())
    for e in metrics["val"]:
        print("    val " + ", ".join(f"{k}={x:.4f}" if k != "step" else f"step={int(x)}"
                                     for k, x in e.items()), flush=True)
    return metrics


def training_mix(data: Path, out: Path) -> Path:
    """``data`` when it is a training-mix manifest; else a one-pass training mix over the
    curation manifest (every source with train tokens at its mixture weight, at most one
    epoch; the plan of ``MixLoader.from_curation``) built into ``out/mix.json``."""
    import yaml

    from tokenmill.manifests.mix import build_mix
    from tokenmill.manifests.mixschema import TrainingMixManifest
    from tokenmill.manifests.verify import read_manifest

    mf, m = read_manifest(data, None)  # whichever kind the file is
    if isinstance(m, TrainingMixManifest):
        return data
    mf = mf.resolve()
    srcs = [s for s in m.sources if s.tokens.get("train", 0) > 0]
    spec = {"name": f"{m.name}-gpu-check", "manifests": [str(mf)], "seed": 0,
            "target_tokens": sum(s.tokens["train"] for s in srcs),
            "sources": {s.name: {"weight": s.mixture_weight, "max_epochs": 1.0} for s in srcs}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "mix.yaml").write_text(yaml.safe_dump(spec))
    build_mix(out / "mix.yaml", out / "mix.json")
    return out / "mix.json"


def ngram_channels(cfg: dict, out: Path) -> tuple[Path, Path]:
    """``tokenmill ngram features`` of the run's mix for the train and val splits, in the
    run's geometry (``seq_len``, global rows per step), into ``out/ngram-{train,val}``."""
    from tokenmill.cli import main as cli

    dirs = []
    for split in ("train", "val"):
        d = out / f"ngram-{split}"
        shutil.rmtree(d, ignore_errors=True)
        argv = ["ngram", "features", cfg["data"], "-o", str(d), "--split", split, "--seq-len",
                str(cfg["seq_len"]), "--batch-size", str(cfg["batch_size"]), "-m",
                str(NGRAM_M), "-q"]
        print(f"  $ tokenmill {' '.join(argv)}", flush=True)
        t0 = time.perf_counter()
        rc = cli(argv)
        check("train", f"tokenmill ngram features --split {split}: exit status", rc, "== 0",
              rc == 0)
        info("train", f"tokenmill ngram features --split {split}: wall time",
             f"{time.perf_counter() - t0:.1f} s")
        dirs.append(d)
    return dirs[0], dirs[1]


def check_run(name: str, m: dict, steps: int, side: bool) -> None:
    """The asserts on one finished run's ``metrics.json``."""
    part = f"train {name}"
    check(part, "steps done", m["steps_done"], f"== {steps}", m["steps_done"] == steps)
    losses = [x for _, x in m["train_loss"]]
    vals = [e["val_loss"] for e in m["val"]]
    bad = sum(not math.isfinite(x) for x in losses + vals)
    check(part, "non-finite train/val losses", bad, "== 0", bad == 0)
    k = max(1, len(losses) // 10)
    first, last = statistics.mean(losses[:k]), statistics.mean(losses[-k:])
    check(part, f"train loss first {k} -> last {k} steps", f"{first:.3f} -> {last:.3f}",
          "falls", last < first)
    check(part, "val loss first -> last", f"{vals[0]:.3f} -> {vals[-1]:.3f}", "falls",
          vals[-1] < vals[0])
    if side:
        masked = sum(int(e["masked_targets"]) for e in m["val"])
        check(part, "masked val targets (all evals)", masked, "== 0", masked == 0)
        worst = max(e["val_loss_masked"] - e["val_loss"] for e in m["val"])
        check(part, "max(masked - unmasked val loss)", worst, "<= 1e-5", worst <= 1e-5)
        check(part, "LEM wait / step time", float(m["lem_wait_frac"]), f"< {LEM_WAIT_MAX:g}",
              m["lem_wait_frac"] < LEM_WAIT_MAX)
    info(part, "tokens/s", f"{m['tokens_per_s']:,.0f}")
    mfu = m.get("mfu")
    info(part, "MFU", f"{100 * mfu:.1f}%" if isinstance(mfu, float) and math.isfinite(mfu)
         else "- (no peak FLOP/s for this device)")


def check_training(sz: Sizes, gpu: bool, data: Path, legality: Path | None, out: Path) -> None:
    """Baseline, every side input (n-gram side channels made first) uninterrupted, and the
    same stopped halfway and resumed; all on the training mix of ``data``."""
    from tokenmill.train.batches import open_data
    from tokenmill.train.config import TrainConfig

    mix = training_mix(data.resolve(), out / "mix")
    base = {**sz.train, "data": str(mix.resolve()), "device": "cuda" if gpu else "cpu",
            "progress": False, "seed": 0}
    budget = open_data(TrainConfig(**base), verify=False).loader().num_steps
    steps = min(base["steps"], budget)
    check("train", f"steps (one pass over {data.name} gives {budget})", steps,
          f">= {base['steps'] * 3 // 4}", steps >= base["steps"] * 3 // 4)
    base["steps"] = steps
    if legality is None:
        legality = toy_legality(base, out / "toy.legality")
    ngram, ngram_val = ngram_channels(base, out)
    side = {**base, "prefix_aux_weight": 0.25, "lem": True, "lem_k": 4,
            "legality": str(legality.resolve()), "ngram_features": str(ngram.resolve()),
            "ngram_val_features": str(ngram_val.resolve())}
    tol = RESUME_TOL["gpu" if gpu else "cpu"]
    m = train_cli(base, out / "baseline", [], gpu)
    check_run("baseline", m, steps, side=False)
    full = train_cli(side, out / "side", [], gpu)
    check_run("side inputs", full, steps, side=True)
    half = steps // 2
    stopped = train_cli(side, out / "side-resumed", ["--stop-after", str(half)], gpu)
    check("train resume", "stopped at step", stopped["steps_done"], f"== {half}",
          stopped["steps_done"] == half and stopped["stopped_early"])
    resumed = train_cli(side, out / "side-resumed", ["--resume"], gpu)
    check_run("side inputs, stopped + resumed", resumed, steps, side=True)
    d = abs(resumed["val"][-1]["val_loss"] - full["val"][-1]["val_loss"])
    check("train resume", "|final val loss resumed - uninterrupted|", d, f"<= {tol:g} nats",
          d <= tol)


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def summary() -> str:
    """The one table of every check and measurement so far."""
    head = ("part", "check", "measured", "limit", "result")
    w = [max(len(r[i]) for r in [head, *ROWS]) for i in range(5)]
    line = "+".join("-" * (x + 2) for x in w)
    out = [" | ".join(c.ljust(w[i]) for i, c in enumerate(head)), line]
    out += [" | ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in ROWS]
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-toy", action="store_true", help="toy sizes on CPU, interpreter")
    p.add_argument("--data", type=Path, help="curation manifest folder (training part)")
    p.add_argument("--legality", type=Path, help="legality table (default on the CPU toy: a "
                   "table from the val pairs)")
    p.add_argument("--out", type=Path, default=Path("/tmp/tokenmill-gpu-check"))
    p.add_argument("--parts", default="kernels,speed,train",
                   help="comma-separated subset of kernels,speed,train")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the parts; 0 when every check holds, 1 at the first failure (one line + table)."""
    args = parse_args(argv)
    gpu = not args.cpu_toy
    if args.cpu_toy:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton

    sz = GPU if gpu else CPU_TOY
    ROWS.clear()
    parts = args.parts.split(",")
    dev = torch.cuda.get_device_name() if gpu and torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, triton {triton.__version__}, device {dev}, "
          f"python {sys.version.split()[0]}", flush=True)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("kernels", lambda: check_kernel_objects(gpu)),
        ("kernels", lambda: check_cross_entropy(sz, gpu)),
        ("kernels", lambda: check_lem(sz, gpu)),
        ("kernels", lambda: check_model(sz, gpu)),
        ("speed", lambda: bench_cross_entropy(sz, gpu)),
        ("speed", lambda: bench_lem(sz, gpu)),
        ("train", lambda: check_training(sz, gpu, args.data, args.legality, args.out)),
    ]
    names = ["kernel objects", "cross-entropy", "LEM", "model", "CE speed", "LEM speed",
             "training"]
    try:
        if gpu:
            check("setup", "CUDA device", dev, "visible to torch", torch.cuda.is_available())
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 comparisons
            torch.backends.cudnn.allow_tf32 = False
        if "train" in parts and args.data is None:
            raise CheckFailed("train: --data (the quickstart manifest folder) is required")
        for (part, fn), name in zip(steps, names, strict=True):
            if part in parts:
                print(f"== {name}", flush=True)
                t0 = time.perf_counter()
                fn()
                print(f"  ({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    except CheckFailed as e:
        print(f"GPU CHECK FAILED: {e}", flush=True)
        print(summary())
        return 1
    except Exception as e:  # an error is a failed check too: one line, then the table
        print(f"GPU CHECK FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0]}",
              flush=True)
        print(summary())
        raise
    print(summary())
    print("GPU CHECK PASSED" if gpu else "CPU TOY CHECK PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
