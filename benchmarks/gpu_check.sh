#!/usr/bin/env bash
# The GPU check of tokenmill's trainer, for one H200 (or H100) in at most 8 minutes, on a
# machine that gets only a copy of the working tree: torch >= 2.11 and triton >= 3.6 there,
# no pydantic, no package registry. What it lacks travels in the git-ignored folder
# out/gpu-carry/ (made HERE beforehand by `bash benchmarks/gpu_vendor.sh`; run tool:
# carry ["out/gpu-carry"]): pydantic's wheels, the quickstart shards, tiktoken's files and a
# gpt2 legality table; training reads out/gpu-carry/mix.json, a training mix over the shards.
#
# What it checks (benchmarks/gpu_check.py; its docstring states every tolerance):
#   1. kernels: compiled JITFunction objects, not the interpreter; fused cross-entropy fwd+bwd
#      vs the fp32 reference, fp32 and bf16, every variant, N x V = 4096 x 50257 and a case
#      with > 2**31 logit elements; the LEM gather fwd+bwd at N=16384, K=4, D=768; the whole
#      GPT-2 small model's loss and every parameter gradient, kernels vs references;
#   2. speed: triton.testing.do_bench of fused CE vs F.cross_entropy (eager, torch.compile)
#      and of the LEM kernel vs its reference;
#   3. training (`tokenmill train`): GPT-2 small, 16 x 1024, ~300 steps, a baseline and a run
#      with every side input, that one also stopped halfway and resumed; no NaN, falling loss,
#      0 masked targets, masked <= unmasked val loss, LEM wait < 10% of step time, the resumed
#      final val loss vs the uninterrupted one; tokens/s and MFU.
# It stops at the first failure with one "GPU CHECK FAILED: ..." line and exit status 1, and
# always ends with one summary table. The same checks at toy sizes on CPU (Triton
# interpreter) run in the test suite: tests/train/test_gpu_check.py (`--cpu-toy`).
#
# Usage: bash benchmarks/gpu_check.sh      (env: PYTHON, CARRY, OUT, PARTS=kernels,speed,train)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CARRY=${CARRY:-out/gpu-carry}
OUT_DIR=${OUT:-/tmp/tokenmill-gpu-check}
PARTS=${PARTS:-kernels,speed,train}
fail() { echo "GPU CHECK FAILED: $*"; exit 1; }

unset TRITON_INTERPRET  # the tests' interpreter switch: must not reach the GPU run
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
[ -d "$CARRY" ] || fail "no $CARRY: run 'bash benchmarks/gpu_vendor.sh' here first and carry it"
export TIKTOKEN_CACHE_DIR="$(cd "$CARRY" && pwd)/tiktoken"

echo "== setup"
$PY -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch',
        torch.__version__, 'triton', triton.__version__)" || fail "no torch/triton in $PY"
mkdir -p "$OUT_DIR"
SITE="$OUT_DIR/site"
HERE_PY=$($PY -c 'import sys; print("cp%d%d (Python %s)" % (*sys.version_info[:2], sys.version.split()[0]))')
WHEEL_PY=$(ls "$CARRY"/wheels 2>/dev/null | sed -n 's/^pydantic_core-[^-]*-\(cp3[0-9]*\)-.*/\1/p' | head -1 || true)
if ! $PY -c "import pydantic" 2>/dev/null; then
  mkdir -p "$SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$CARRY"/wheels/*.whl \
    || fail "pip could not install the carried wheels: pydantic-core is built for $WHEEL_PY, \
this is $HERE_PY; rerun benchmarks/gpu_vendor.sh with GPU_PY=<this Python's X.Y>"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import pydantic, pydantic_core; print('pydantic', pydantic.__version__)" \
  || fail "pydantic does not import: the carried pydantic-core is for $WHEEL_PY x86_64, \
this is $HERE_PY; rerun benchmarks/gpu_vendor.sh with GPU_PY=<this Python's X.Y>"
$PY -c "import tokenmill.cli, tokenmill.train.train" || fail "tokenmill does not import"

LEG="$OUT_DIR/gpt2_val_rows.legality"
if [[ ",$PARTS," == *",train,"* ]]; then
  [ -e "$CARRY/mix.json" ] || fail "no $CARRY/mix.json (benchmarks/gpu_vendor.sh makes it)"
  gzip -dc "$CARRY/gpt2_val_rows.legality.gz" > "$LEG" || fail "cannot unpack the legality table"
fi

$PY benchmarks/gpu_check.py --data "$CARRY/mix.json" --legality "$LEG" --out "$OUT_DIR" \
  --parts "$PARTS" || { rc=$?; rm -rf "$OUT_DIR"/*/checkpoints; exit $rc; }
rm -rf "$OUT_DIR"/*/checkpoints  # ~2 GB each of model + optimizer state
