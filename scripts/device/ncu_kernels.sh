#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's sections (speed of light, memory, warp states, scheduler,
# launch stats, occupancy) for the first launches of the kernels whose name matches a regex, inside
# one benchmark command. Writes ncu_kernels.txt (ncu's report as text) under $OUT.
# Usage (device): scripts/device/ncu_kernels.sh REGEX COUNT BENCH [ARGS...]
#   e.g. scripts/device/ncu_kernels.sh 'Wgmma' 2 expert_prefill_bench --tokens=8192 --only=wgmma
# BENCH is a binary of the bundle's tests/ directory. Clocks and caches are left alone, as in
# profile_80b.sh, so the timings are the kernel's under normal clocks.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
[ $# -ge 3 ] || { echo "usage: ncu_kernels.sh REGEX COUNT BENCH [ARGS...]" >&2; exit 2; }
regex=$1 count=$2 bench=$3
shift 3
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu_kernels: no ncu on this machine" | tee "$out/ncu_kernels.txt"; exit 1; }
timeout "${NCU_TIMEOUT:-300}" "$ncu" --kernel-name "regex:$regex" --launch-count "$count" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis \
  --clock-control none --cache-control none \
  "$bundle/tests/$bench" "$@" >"$out/ncu_kernels.txt" 2>&1
rc=$?
echo "ncu_kernels: rc=$rc" >>"$out/ncu_kernels.txt"
exit $rc
