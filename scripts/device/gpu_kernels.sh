#!/usr/bin/env bash
# The dense CUDA kernels' parity tests and micro-benchmarks on the GPU machine.
#
#   scripts/device/gpu_kernels.sh bundle   (here) builds gpu_kernels_test and gpu_kernels_bench
#       (Release, sm_90a) in build-gpu-kernels and copies them, with the shared libraries that
#       Ubuntu 24.04 lacks (Abseil; not CUDA's, which the machine has), into .device-gpu-kernels/
#       (git-ignored through .git/info/exclude). Carry that folder to the device.
#   scripts/device/gpu_kernels.sh run      (on the GPU machine) runs the tests, then the benchmarks,
#       writing gpu_kernels_test.log / .xml, gpu_kernels_bench.log / .json and report.txt under
#       $OUT (default ./gpu-kernels-out). With SANITIZE=1 it also runs compute-sanitizer memcheck
#       over the tests.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bundle=.device-gpu-kernels

case "${1:-}" in
  bundle)
    set -e
    export PATH=/usr/local/cuda/bin:$PATH
    build=${BUILD_DIR:-build-gpu-kernels}
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_ENABLE_CUDA=ON >/dev/null
    ninja -C "$build" -j2 gpu_kernels_test gpu_kernels_bench
    rm -rf "$bundle"
    mkdir -p "$bundle/lib"
    cp "$build/tests/gpu/gpu_kernels_test" "$build/tests/gpu/gpu_kernels_bench" "$bundle/"
    strip --strip-unneeded "$bundle/gpu_kernels_test" "$bundle/gpu_kernels_bench"
    for f in "$bundle/gpu_kernels_test" "$bundle/gpu_kernels_bench"; do
      ldd "$f" | awk '/=> \//{print $3}'
    done | sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libabsl_*|libgtest*|libgmock*) cp -L "$lib" "$bundle/lib/" ;;
      esac
    done
    grep -qx "/$bundle/" .git/info/exclude 2>/dev/null || echo "/$bundle/" >> .git/info/exclude
    du -sh "$bundle"
    ;;
  run)
    out=${OUT:-$root/gpu-kernels-out}
    mkdir -p "$out"
    # CUDA's libraries: the system's, else the toolkit's, else the ones PyTorch's wheels carry.
    extra=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
             $(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null); do
      [ -e "$d/libcublasLt.so.13" ] && extra="$extra:$d"
    done
    export LD_LIBRARY_PATH="$root/$bundle/lib$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
    echo "== tests" | tee "$out/report.txt"
    "$bundle/gpu_kernels_test" --gtest_output="xml:$out/gpu_kernels_test.xml" > "$out/gpu_kernels_test.log" 2>&1
    test_rc=$?
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|rel|Expected|Which is|actual' \
      "$out/gpu_kernels_test.log" | tail -60 | tee -a "$out/report.txt"
    echo "== benchmarks" | tee -a "$out/report.txt"
    timeout 240 "$bundle/gpu_kernels_bench" --json="$out/gpu_kernels_bench.json" > "$out/gpu_kernels_bench.log" 2>&1
    bench_rc=$?
    cat "$out/gpu_kernels_bench.log" | tee -a "$out/report.txt"
    if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
      echo "== compute-sanitizer memcheck" | tee -a "$out/report.txt"
      timeout 90 compute-sanitizer --tool memcheck --print-limit 20 "$bundle/gpu_kernels_test" \
        --gtest_filter='*Attention*/0:*Gdn*/0:*Streams*:*Sampling*:*/q4_K:*/q6_K:*/q8_0' > "$out/sanitizer.log" 2>&1
      echo "sanitizer rc=$?" | tee -a "$out/report.txt"
      grep -E "ERROR SUMMARY|Invalid|out of bounds" "$out/sanitizer.log" | head -20 | tee -a "$out/report.txt"
    fi
    echo "tests rc=$test_rc bench rc=$bench_rc" | tee -a "$out/report.txt"
    [ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ]
    ;;
  *)
    echo "usage: $0 bundle|run" >&2
    exit 2
    ;;
esac
