#!/usr/bin/env bash
# Run HERE (a machine with a network and ../shared/data) before benchmarks/gpu_check.sh: fills
# the git-ignored folder out/gpu-carry/ with everything the GPU machine lacks, to be carried
# with the working tree (run tool: carry ["out/gpu-carry"], 64 MiB in all with the tree):
#
#   wheels/      pydantic and its needs (pydantic-core is compiled: one manylinux x86_64 wheel
#                for CPython $GPU_PY, default 3.12, the Python the H200 image was seen with;
#                gpu_check.sh prints one clear line if the import fails there). torch, triton,
#                numpy, numba, pyarrow, pyyaml, tqdm, tiktoken, matplotlib are in that image.
#   quickstart/  manifest.json + shards/ of the quickstart curation (DATA, default
#                out/quickstart; made with `tokenmill run manifests/quickstart.yaml` when absent)
#   mix.json     a training mix over it (`tokenmill mix build`) with room for ~340 steps
#                of 16 x 1024 (the curation read once at its weights gives ~140)
#   tiktoken/    tiktoken's cache files (TIKTOKEN_CACHE_DIR, default ../shared/data/tiktoken)
#   gpt2_val_rows.legality.gz  a sound gpt2 legality table, rows built for the previous tokens
#                of the GPU run's validation rows (others allow everything), gzip'd (the raw
#                table is 316 MB of mostly 0xFF)
#
# Usage: bash benchmarks/gpu_vendor.sh     (env: PYTHON, DATA, GPU_PY, CARRY, VAL_TOKENS)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DATA=${DATA:-out/quickstart}
GPU_PY=${GPU_PY:-3.12}
CARRY=${CARRY:-out/gpu-carry}
VAL_TOKENS=${VAL_TOKENS:-65536}
export TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-$PWD/../shared/data/tiktoken}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_USAGE_STATS_ENABLED=0
git check-ignore -q "$CARRY" || { echo "FAIL: $CARRY is not git-ignored"; exit 1; }
rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"

echo "== wheels for CPython $GPU_PY manylinux x86_64 (pinned to this venv's versions)"
pins=$($PY - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
               ("pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                "typing-extensions")))
EOF
)
plat=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat="$plat --platform $p"
done
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PY" \
  --implementation cp $plat -d "$CARRY/wheels" $pins
ls "$CARRY/wheels"

echo "== quickstart shards from $DATA"
if [ ! -e "$DATA/manifest.json" ]; then
  [ "$DATA" = out/quickstart ] || { echo "FAIL: no $DATA/manifest.json"; exit 1; }
  echo "no $DATA/manifest.json: running tokenmill run manifests/quickstart.yaml -o $DATA"
  TOKENMILL_DATA_ROOT=${TOKENMILL_DATA_ROOT:-$PWD/../shared/data/corpora} \
    $PY -m tokenmill.cli run manifests/quickstart.yaml -o "$DATA"
fi
mkdir -p "$CARRY/quickstart"
cp "$DATA/manifest.json" "$CARRY/quickstart/"
cp -r "$DATA/shards" "$CARRY/quickstart/"

echo "== training mix over it: ~5.6M tokens, every source up to 2 epochs (the curation"
echo "   alone, one pass at its mixture weights, gives only ~140 steps of 16 x 1024)"
cat > "$CARRY/mix-spec.yaml" <<'SPEC'
name: gpu-check-mix
manifests: [quickstart/manifest.json]
target_tokens: 5_600_000
seed: 0
on_shortfall: redistribute
sources:
  code-docs: {source: python-docs-rst, weight: 0.55, max_epochs: 2}
  books: {source: books-public-domain, weight: 0.17, max_epochs: 2}
  wiki: {source: wikipedia-wikitext-sample, weight: 0.14, max_epochs: 2}
  c4: {source: c4-en-sample, weight: 0.12, max_epochs: 2}
  web: {source: cc-main-2019-sample, weight: 0.02, max_epochs: 2}
SPEC
$PY -m tokenmill.cli mix build "$CARRY/mix-spec.yaml" -o "$CARRY/mix.json" | tail -1

echo "== tiktoken files from $TIKTOKEN_CACHE_DIR"
cp -r "$TIKTOKEN_CACHE_DIR" "$CARRY/tiktoken"

echo "== gpt2 legality rows for the validation set ($VAL_TOKENS tokens at seq 1024)"
$PY - "$CARRY" "$VAL_TOKENS" <<'EOF'
import gzip, shutil, sys
from pathlib import Path
from tokenmill.train.batches import open_data
from tokenmill.train.config import TrainConfig
from tokenmill.train.targets import save_rows_table
carry, val_tokens = Path(sys.argv[1]), int(sys.argv[2])
cfg = TrainConfig(data=str(carry / "mix.json"), seq_len=1024, val_tokens=val_tokens)
val = open_data(cfg).validation_rows(cfg.val_tokens)
p = save_rows_table("gpt2", val[:, :-1].reshape(-1).numpy(), carry / "gpt2_val_rows.legality")
with open(p, "rb") as src, gzip.open(str(p) + ".gz", "wb", compresslevel=6) as dst:
    shutil.copyfileobj(src, dst, 1 << 24)
p.unlink()
print(f"{p}.gz: rows of {len(set(val[:, :-1].reshape(-1).tolist()))} previous tokens")
EOF

tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
carry=$(du -sb "$CARRY" | cut -f1)
total=$((tree + carry))
echo "carried: $CARRY $((carry / 1048576)) MiB + working tree $((tree / 1048576)) MiB" \
     "= $((total / 1048576)) MiB (limit 64 MiB)"
[ "$total" -lt $((64 * 1048576)) ] || { echo "FAIL: over the 64 MiB limit"; exit 1; }
echo "ready: run tool with carry [\"$CARRY\"] and command: bash benchmarks/gpu_check.sh"
