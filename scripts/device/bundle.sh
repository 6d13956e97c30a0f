#!/usr/bin/env bash
# Builds Tandem here for the GPU machine (Release, CUDA sm_90a + compute_90 PTX) and bundles the
# binaries with the shared libraries that machine may lack (Ubuntu 24.04 has no gRPC or Abseil):
# every library `ldd` resolves outside glibc/libstdc++/CUDA's driver goes into .device-bundle/lib.
# Carry .device-bundle (and nothing else) to the device and run scripts/device/run_all.sh there.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PATH=/usr/local/cuda/bin:$PATH
build=${BUILD_DIR:-build-device}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_ENABLE_CUDA=ON >/dev/null
cmake --build "$build" -j "$(nproc)"
out=.device-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/tests"
# Executables: the tools, the worker, the service, and every test binary.
for f in "$build"/gpu_service/tandem "$build"/gpu_service/tandem-gpu-service \
         "$build"/host_expert_worker/tandem-host-worker; do
  [ -x "$f" ] && cp "$f" "$out/bin/"
done
find "$build/tests" -type f -executable -name '*_test' -exec cp {} "$out/tests/" \;
find "$build/tests" -type f -executable -name '*_main' -exec cp {} "$out/tests/" \; 2>/dev/null || true
strip --strip-unneeded "$out"/bin/* "$out"/tests/* 2>/dev/null || true
# Shared libraries: everything ldd finds except the C runtime, libstdc++/libgcc and CUDA's driver.
for f in "$out"/bin/* "$out"/tests/*; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
cp -r scripts/device "$out/scripts"
du -sh "$out"
