#!/usr/bin/env bash
# Prepared GPU check for tokenmill's trainer: one script for one GPU machine (H100/H200 class,
# about 8 minutes of a 15-minute device budget). Not run by CI; nothing here is timed in tests.
#
#   1. the Triton kernel tests, compiled (same comparisons as on CPU, on CUDA tensors);
#   2. fused cross-entropy (forward + backward) against torch's F.cross_entropy on
#      GPT-2-sized logits (16 x 1024 positions x 50,304 padded vocabulary, bf16): time, peak
#      extra memory and the ratio; plus the legality-mask and prefix-loss variants;
#   3. a short GPT-2 small training run (12 x 768, seq 1024, bf16 autocast) on the quickstart
#      shards, printing tokens/s and MFU.
#
# Needs: a Python with CUDA torch + triton, pytest, pydantic, pyarrow, numpy, numba, tqdm, yaml,
# matplotlib (PYTHON=...), and the quickstart shards (DATA=..., default out/quickstart; carry
# that folder to the device machine: it is git-ignored). No network, no tiktoken files needed.
#
# Usage: bash benchmarks/gpu_check.sh            (env: PYTHON, DATA, STEPS, BATCH, OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=${DATA:-out/quickstart}
STEPS=${STEPS:-200}
BATCH=${BATCH:-16}
OUT_DIR=${OUT:-/tmp/tokenmill-gpu-check}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== environment"
$PY - <<'EOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(f"torch {torch.__version__}  triton {triton.__version__}  "
      f"device {torch.cuda.get_device_name()}  capability {torch.cuda.get_device_capability()}")
EOF

echo "== 1. kernel tests, compiled (TOKENMILL_KERNEL_DEVICE=cuda)"
if $PY -c "import pytest" 2>/dev/null; then
  TOKENMILL_KERNEL_DEVICE=cuda $PY -m pytest -q -p no:cacheprovider tests/train/test_kernels.py \
    || echo "KERNEL TESTS FAILED"
else
  echo "pytest not installed: skipped"
fi

echo "== 2. fused cross-entropy vs F.cross_entropy (fwd+bwd, bf16 logits)"
$PY - <<'EOF'
import statistics
import torch
import torch.nn.functional as F
from tokenmill.train.kernels import fused_cross_entropy, pack_mask_rows

torch.manual_seed(0)
dev = "cuda"
N, V, VP = 16 * 1024, 50257, 50304
base = (torch.randn(N, VP, device=dev) * 2).to(torch.bfloat16)
tgt = torch.randint(0, V, (N,), device=dev)
aux = torch.randint(-1, V, (N,), device=dev)
prev = torch.randint(0, V, (N,), device=dev)
allowed = torch.rand(V, V, device=dev) < 0.9
allowed[prev, tgt] = True
bits = pack_mask_rows(allowed)
del allowed

def fused(x):
    return fused_cross_entropy(x, tgt, vocab_size=V)

def fused_mask(x):
    return fused_cross_entropy(x, tgt, vocab_size=V, prev_ids=prev, mask_bits=bits)

def fused_aux(x):
    return fused_cross_entropy(x, tgt, vocab_size=V, aux_targets=aux, aux_weight=0.3)

def torch_bf16(x):
    return F.cross_entropy(x[:, :V], tgt)

def torch_fp32(x):  # what speedrun-style trainers do: upcast the logits
    return F.cross_entropy(x[:, :V].float(), tgt)

def bench(fn, iters=20):
    x = base.clone().requires_grad_()
    for _ in range(3):
        fn(x).backward()
        x.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    m0 = torch.cuda.memory_allocated()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = fn(x)
        loss.backward()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
        x.grad = None
    peak = (torch.cuda.max_memory_allocated() - m0) / 2**20
    return statistics.median(ts), peak, float(loss.detach())

rows = [(name, *bench(fn)) for name, fn in [
    ("torch F.cross_entropy bf16", torch_bf16),
    ("torch F.cross_entropy fp32", torch_fp32),
    ("tokenmill fused", fused),
    ("tokenmill fused + mask", fused_mask),
    ("tokenmill fused + prefix", fused_aux),
]]
ref = rows[0][1]
ref32 = rows[1][1]
print(f"logits [{N}, {VP}] bf16, vocabulary {V}; median of 20 fwd+bwd")
print(f"{'implementation':<28} {'ms':>8} {'extra MiB':>10} {'loss':>9} {'vs bf16':>8} "
      f"{'vs fp32':>8}")
for name, ms, mib, loss in rows:
    print(f"{name:<28} {ms:>8.2f} {mib:>10.0f} {loss:>9.4f} {ref / ms:>7.2f}x {ref32 / ms:>7.2f}x")
EOF

echo "== 3. GPT-2 small on $DATA ($STEPS steps x $BATCH x 1024 tokens, bf16 autocast)"
if [ ! -e "$DATA/manifest.json" ]; then
  echo "no manifest at $DATA: carry out/quickstart (or set DATA) to run the training check"
  exit 0
fi
cat > "$OUT_DIR/gpt2.json" <<EOF
{"data": "$(cd "$DATA" && pwd)", "out_dir": "$OUT_DIR/gpt2-small",
 "model": "gpt2-small", "seq_len": 1024, "batch_size": $BATCH, "steps": $STEPS,
 "lr": 1.5e-3, "warmup_steps": 20, "weight_decay": 0.1, "val_every": 100,
 "val_tokens": 65536, "device": "cuda", "progress": false}
EOF
$PY -m tokenmill.cli train "$OUT_DIR/gpt2.json" --no-progress
rm -rf "$OUT_DIR/gpt2-small/checkpoints"  # ~1.5 GB of model + optimizer state
