#!/usr/bin/env bash
# On the GPU machine: the issue's end-to-end benchmark on q3n-80b shapes with every expert resident.
# Generates the model unless an earlier run left one (47 GB, every CPU thread; in $MODEL_DIR, else
# /dev/shm when it has room, else /tmp: device_env.sh's model_dir), then runs gpu_backend_bench
# (decode batch 1/8/32, prefill 512/8192, each against the HBM and bf16-GEMM floors measured in the
# same run). Writes bench_80b.txt / bench_80b.json under $OUT.
# Usage (device): scripts/device/bench_80b.sh [extra gpu_backend_bench flags]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
free_gb=$(shm_free_gb)
dir=${MODEL_DIR:-$(model_dir)}  # an earlier run's model, else a new one
model=$dir/q3n-80b.gguf
{
  echo "# bench_80b $(date -u +%FT%TZ), commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; model in $dir (${free_gb:-?} GB free in /dev/shm)"
} | tee "$out/bench_80b.txt"
if [ ! -f "$model" ]; then
  /usr/bin/time -f "gen-model: %e s, max RSS %M KB" "$bundle/bin/tandem" gen-model --preset q3n-80b --out "$model" \
    --threads "$(nproc)" 2>&1 | tail -2 | tee -a "$out/bench_80b.txt"
fi
"$bundle/tests/gpu_backend_bench" --model "$model" --json "$out/bench_80b.json" "$@" 2>&1 | tee -a "$out/bench_80b.txt"
