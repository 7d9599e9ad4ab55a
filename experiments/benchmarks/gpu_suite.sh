#!/usr/bin/env bash
# GPU benchmarks in one prepared run; results go to $OUT, each part bounded by `timeout`, so one
# failing part leaves the others' results.
#   OUT=/path/to/out bash experiments/benchmarks/gpu_suite.sh              # every part (~14 min)
#   OUT=... PARTS="moe train attention decode" bash experiments/benchmarks/gpu_suite.sh
#   OUT=... PARTS="train_wide train breakdown_wide" bash experiments/benchmarks/gpu_suite.sh  # MFU, where time goes
# Parts: moe train train_wide attention decode breakdown breakdown_wide (experiments/benchmarks/gpu_kernels.py:
# kernels, MFU, decode, the train step piece by piece),
# rl (one RL update of a 32k-token trajectory, rl_scale.py's gpu_update), muon (Newton-Schulz and the optimizer step, muon_gpu.py), aot (deviceless 8-GPU compilation,
# gpu_aot.py), paths (moe_paths.py's float32 table). Needs jax, optax, numpy and tokamax with its
# dependencies (carried as wheels on a machine without a registry: docs/benchmarks.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_suite}"
PY="${PYTHON:-python3}"
PARTS="${PARTS:-moe train train_wide attention decode breakdown rl muon aot paths}"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
mkdir -p "$OUT"

run_parts() {
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
"$PY" -c 'from research.model import kernels
print("tokamax GPU kernels that compile here:", {op: kernels.gpu_kernels(op) for op in ("ragged_dot", "attention")})'

declare -A LIMIT=([moe]=180 [train]=240 [train_wide]=300 [attention]=80 [decode]=50 [breakdown]=150
                  [breakdown_wide]=150)
for part in $PARTS; do
  case "$part" in
    moe|train|train_wide|attention|decode|breakdown|breakdown_wide)
      timeout "${LIMIT[$part]}" "$PY" -m experiments.benchmarks.gpu_kernels --part="$part" \
        --json="$OUT/gpu_$part.json" || echo "$part failed: $?";;
    rl)
      timeout 100 "$PY" -m experiments.benchmarks.rl_scale --parts=gpu_update --workdir=/tmp/rl_scale \
        --json="$OUT/rl_update.json" || echo "rl_update failed: $?";;
    muon)
      timeout 180 "$PY" -m experiments.benchmarks.muon_gpu --json="$OUT/muon_gpu.json" \
        || echo "muon_gpu failed: $?";;
    aot)
      timeout 120 "$PY" -m experiments.benchmarks.gpu_aot --json="$OUT/gpu_aot.json" \
        || echo "gpu_aot failed: $?";;
    paths)
      timeout 150 "$PY" -m experiments.benchmarks.moe_paths --tokens=8192 --d_model=2048 --d_expert=1024 \
        --top_k=8 --experts=8,32,128 --json="$OUT/moe_paths_gpu.json" || echo "moe_paths failed: $?";;
    *) echo "unknown part $part";;
  esac
done
}

# The whole log also in $OUT: every part's rows and tables, those of a part killed by its limit too.
run_parts 2>&1 | tee "$OUT/suite.log"
