#!/usr/bin/env bash
# The CUDA backend's end-to-end tests and stage profile on the GPU machine.
#
#   scripts/device/gpu_backend.sh bundle   (here) builds gpu_backend_test and gpu_backend_profile
#       (Release, sm_90a) in build-gpu-backend and copies them, with the shared libraries that
#       Ubuntu 24.04 lacks (Abseil, GoogleTest; not CUDA's, which the machine has), into
#       .device-gpu-backend/ (git-ignored through .git/info/exclude). Carry that folder.
#   scripts/device/gpu_backend.sh run      (on the GPU machine) generates the presets once into
#       /tmp/tandem-gpu-backend-models, runs the tests, then the profile (tiny and small, exact and
#       fast), writing gpu_backend_test.log / .xml, profile.log and report.txt under $OUT (default
#       ./gpu-backend-out).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bundle=.device-gpu-backend

case "${1:-}" in
  bundle)
    set -e
    export PATH=/usr/local/cuda/bin:$PATH
    build=${BUILD_DIR:-build-gpu-backend}
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_ENABLE_CUDA=ON >/dev/null
    ninja -C "$build" -j2 gpu_backend_test gpu_backend_profile
    rm -rf "$bundle"
    mkdir -p "$bundle/lib"
    cp "$build/tests/gpu_backend/gpu_backend_test" "$build/tests/gpu_backend/gpu_backend_profile" "$bundle/"
    strip --strip-unneeded "$bundle/gpu_backend_test" "$bundle/gpu_backend_profile"
    for f in "$bundle/gpu_backend_test" "$bundle/gpu_backend_profile"; do
      ldd "$f" | awk '/=> \//{print $3}'
    done | sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*) ;;
        libcudart*|libcublas*) ;;  # the machine's CUDA 13 has them (and cuBLASLt is ~500 MB)
        *) cp -L "$lib" "$bundle/lib/" ;;
      esac
    done
    grep -qx "/$bundle/" .git/info/exclude 2>/dev/null || echo "/$bundle/" >> .git/info/exclude
    du -sh "$bundle"
    ;;
  run)
    out=${OUT:-$root/gpu-backend-out}
    mkdir -p "$out"
    extra=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
             $(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null); do
      [ -e "$d/libcublasLt.so.13" ] && extra="$extra:$d"
    done
    export LD_LIBRARY_PATH="$root/$bundle/lib$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export TANDEM_GPU_BACKEND_MODELS=${TANDEM_GPU_BACKEND_MODELS:-/tmp/tandem-gpu-backend-models}
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
    echo "== tests" | tee "$out/report.txt"
    timeout "${TEST_TIMEOUT:-300}" "$bundle/gpu_backend_test" --gtest_output="xml:$out/gpu_backend_test.xml" \
      > "$out/gpu_backend_test.log" 2>&1
    test_rc=$?
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|^\[(tiny|small)|Failure|Expected|Which is|actual|error' \
      "$out/gpu_backend_test.log" | tail -80 | tee -a "$out/report.txt"
    echo "== profile" | tee -a "$out/report.txt"
    timeout "${PROFILE_TIMEOUT:-150}" "$bundle/gpu_backend_profile" ${PROFILE_PRESETS:-tiny small} > "$out/profile.log" 2>&1
    prof_rc=$?
    tee -a "$out/report.txt" < "$out/profile.log"
    echo "tests rc=$test_rc profile rc=$prof_rc" | tee -a "$out/report.txt"
    [ "$test_rc" = 0 ] && [ "$prof_rc" = 0 ]
    ;;
  *)
    echo "usage: $0 bundle|run" >&2
    exit 2
    ;;
esac
