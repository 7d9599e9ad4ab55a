#!/usr/bin/env bash
# GPU benchmarks in one run (under 8 minutes in all; the Muon part under 4). Results go to $OUT.
#   OUT=/path/to/out bash experiments/benchmarks/gpu_suite.sh
# Needs only jax, optax and numpy on the machine. Each part is bounded by `timeout`, so one
# failing part leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_suite}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"

# Muon: NS throughput on a Kimi-like expert stack, optimizer step against optax (one GPU).
timeout 180 "$PY" -m experiments.benchmarks.muon_gpu --json="$OUT/muon_gpu.json" \
  || echo "muon_gpu failed: $?"
# Muon: how the sharded update's collectives are scheduled when compiled for 8 H100s (deviceless
# compilation through the CUDA plugin's topology; nothing runs, the GPU is not used).
timeout 120 "$PY" -m experiments.benchmarks.gpu_aot --json="$OUT/gpu_aot.json" \
  || echo "gpu_aot failed: $?"

# MoE expert paths on the GPU: ragged_dot (grouped GEMM) vs blocked vs dense, compiled FLOPs and tokens/s.
timeout 150 "$PY" -m experiments.benchmarks.moe_paths --tokens=8192 --d_model=2048 --d_expert=1024 \
  --top_k=8 --experts=8,32,128 --json="$OUT/moe_paths_gpu.json" || echo "moe_paths failed: $?"
