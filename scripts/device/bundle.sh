#!/usr/bin/env bash
# Builds Tandem here for the GPU machine (Release, CUDA sm_90a + compute_90 PTX) and bundles the
# binaries with the shared libraries that machine may lack (Ubuntu 24.04 has no gRPC or Abseil):
# every library `ldd` resolves outside glibc/libstdc++/CUDA's driver goes into .device-bundle/lib.
# Carry .device-bundle (and nothing else) to the device and run scripts/device/run_all.sh there.
# TARGETS (default below) picks what is built and bundled; EXTRA adds files under extra/ (below).
# PACK=.device-pack/NAME.tar.xz also writes the bundle as one archive to carry instead (xz -9: the
# binaries share most of their code, so the large dictionary matters; a 232 MB bundle packed to
# 26 MB at -9 against 66 MB at -3, 2026-12-01), with the whole scripts/ folder under repo/ so that a
# run can use the scripts of the bundled commit: `bash $BUNDLE/repo/scripts/device/run_all.sh`.
set -euo pipefail
shopt -s nullglob  # a bundle of tests only has an empty bin/
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PATH=/usr/local/cuda/bin:$PATH
build=${BUILD_DIR:-build-device}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_ENABLE_CUDA=ON >/dev/null
# Only what the device run needs (a full build of every CPU test is not needed there).
targets=${TARGETS:-tandem tandem-host-worker tandem-gpu-service gpu_kernels_test gpu_moe_kernels_test gpu_backend_test
  service_integration_test gpu_kernels_bench gpu_moe_bench gpu_backend_profile gpu_backend_bench attention_bench
  gdn_bench expert_prefill_bench prefill_stages_bench gpu_backend_timeline}
cmake --build "$build" -j "$(nproc)" --target $targets
out=${BUNDLE_DIR:-.device-bundle}  # a helper building its own bundle names another folder
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/tests"
# Executables: those of the tools, the worker and the service that TARGETS names (an earlier
# build's service binary, 48 MB, stays out of a bundle that does not ask for it), and every test
# binary it names.
for t in $targets; do
  case "$t" in
    tandem|tandem-gpu-service) [ -x "$build/gpu_service/$t" ] && cp "$build/gpu_service/$t" "$out/bin/" ;;
    tandem-host-worker) [ -x "$build/host_expert_worker/$t" ] && cp "$build/host_expert_worker/$t" "$out/bin/" ;;
    *_test|*_bench|*_profile|*_timeline) find "$build/tests" -type f -executable -name "$t" -exec cp {} "$out/tests/" \; ;;
  esac
done
# EXTRA="FILE ...": more files for the bundle's root, e.g. other builds' gpu_backend_bench to A/B
# in the same call (ab_80b.sh 'label:AB_BIN=$BUNDLE/NAME'); in one xz archive they cost little,
# since they share most of their code with the bundle's own.
mkdir -p "$out/extra"
for f in ${EXTRA:-}; do
  if [ ! -f "$f" ]; then
    echo "bundle: EXTRA file '$f' does not exist" >&2
    exit 2
  fi
  cp "$f" "$out/extra/"
done
git rev-parse --short HEAD >"$out/COMMIT"
strip --strip-unneeded "$out"/bin/* "$out"/tests/* "$out"/extra/* 2>/dev/null || true
# Shared libraries: everything ldd finds except the C runtime, libstdc++/libgcc and CUDA's own
# libraries (the device machine has CUDA 13; cuBLAS alone would exceed the 64 MiB carry limit).
for f in "$out"/bin/* "$out"/tests/* "$out"/extra/*; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}' || true
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libcudart*|libcublas*|libnvrtc*|libcufft*|libcurand*|libcusparse*|libnvJitLink*) ;;  # the device has CUDA 13
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
mkdir -p "$out/repo"
cp -r scripts "$out/repo/"
du -sh "$out"
if [ -n "${PACK:-}" ]; then
  mkdir -p "$(dirname "$PACK")"
  tar -C "$out" -cf - . | xz -9 -T2 >"$PACK"
  du -sh "$PACK"
  # The device call carries the pack with the repository's work tree, 64 MiB in all
  # (/work/.library/device/README.md): say so here rather than on the call.
  pack_mib=$(( $(stat -c %s "$PACK") / 1048576 ))
  tree_mib=$(( $(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }') / 1048576 ))
  if (( pack_mib + tree_mib >= 64 )); then
    echo "bundle: WARNING: $PACK (${pack_mib} MiB) and the work tree (~${tree_mib} MiB) exceed the" \
         "64 MiB a device call carries; bundle fewer TARGETS or EXTRA files" >&2
  fi
fi
