#!/usr/bin/env bash
# Builds, bundles and runs the MoE-side CUDA kernel parity tests and benchmarks.
#
#   scripts/device/gpu_moe_kernels.sh bundle BUILD_DIR   # here: copy the binaries and the shared
#                                                        # libraries a CUDA 13 Ubuntu host lacks
#                                                        # (Abseil) into .device-gpu-moe/
#   scripts/device/gpu_moe_kernels.sh run                # on the GPU machine (the device tool's
#                                                        # `run`, with carry [".device-gpu-moe"]):
#                                                        # tests then benchmarks, logs under $OUT
#
# BUILD_DIR must hold gpu_moe/gpu_moe_kernels_test and gpu_moe/gpu_moe_bench (or the same under
# tests/gpu_moe/ in a full-tree build). The bundle folder is git-ignored via .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=.device-gpu-moe

case "${1:-}" in
  bundle)
    build="${2:?build directory}"
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/lib"
    for name in gpu_moe_kernels_test gpu_moe_bench; do
      bin=$(find "$build" -type f -name "$name" -perm -u+x | head -n1)
      [ -n "$bin" ] || { echo "no $name under $build" >&2; exit 1; }
      cp "$bin" "$BUNDLE/"
      # Abseil (and anything else outside the CUDA toolkit and glibc/libstdc++) travels along.
      ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libabsl|libgtest|libgmock' | xargs -r -I{} cp -L {} "$BUNDLE/lib/"
    done
    grep -qx "/$BUNDLE/" .git/info/exclude 2>/dev/null || echo "/$BUNDLE/" >> .git/info/exclude
    du -sh "$BUNDLE"
    ;;
  run)
    out="${OUT:-/tmp/gpu-moe-out}"
    mkdir -p "$out"
    export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total --format=csv > "$out/gpu.txt" 2>&1 || true
    status=0
    "$BUNDLE/gpu_moe_kernels_test" --gtest_output="json:$out/gpu_moe_kernels_test.json" 2>&1 \
      | tee "$out/gpu_moe_kernels_test.log" | grep -E '^\[ *(FAILED|PASSED|SKIPPED) ' || true
    grep -q '^\[  PASSED  \]' "$out/gpu_moe_kernels_test.log" && ! grep -q '^\[  FAILED  \]' "$out/gpu_moe_kernels_test.log" || status=1
    "$BUNDLE/gpu_moe_bench" 2>&1 | tee "$out/gpu_moe_bench.txt" || status=1
    exit $status
    ;;
  *)
    echo "usage: $0 bundle BUILD_DIR | run" >&2
    exit 2
    ;;
esac
