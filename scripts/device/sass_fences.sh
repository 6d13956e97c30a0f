#!/usr/bin/env bash
# On the GPU machine (its image has cuobjdump): the memory fences and cluster barriers in the
# machine code of every kernel of a bundled binary, one line per kernel that has any, so that the
# fences on the decode step's path can be listed before they are measured. A cluster arrive with
# release semantics (cluster_barrier.cuh's ClusterArrive, cg's cluster.sync) compiles to
# MEMBAR.ALL.GPU before UCGABAR_ARV, a GPU-scope fence that waits for the block's outstanding memory
# operations; relaxing two of them in the fused MoE kernel made batch-1 decode 3.7% faster on the
# H200 (docs/PERF.md, forty-eighth session). Writes sass_fences.txt under $OUT.
# Usage (device): scripts/device/sass_fences.sh [binary, default the bundle's gpu_backend_bench]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
bin=${1:-$bundle/tests/gpu_backend_bench}
report=$out/sass_fences.txt
if ! command -v cuobjdump >/dev/null; then
  echo "sass_fences: no cuobjdump on this machine" | tee "$report"
  exit 1
fi
[ -f "$bin" ] || { echo "sass_fences: no binary '$bin'" | tee "$report"; exit 2; }
{
  echo "# sass_fences $(date -u +%FT%TZ), commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown), $bin"
  echo "# counts per kernel: MEMBAR.SC.GPU MEMBAR.ALL.GPU MEMBAR.ALL.CTA UCGABAR_ARV UCGABAR_WAIT CCTL.IVALL SYNCS(mbarrier) STAS(st.async)"
  cuobjdump -sass "$bin" 2>/dev/null | awk '
    function flush() {
      if (name != "" && (sc + gpu + cta + arv + wt + iv) > 0)
        printf "%3d %3d %3d %3d %3d %3d %3d %3d  %s\n", sc, gpu, cta, arv, wt, iv, sy, st, name
    }
    /Function :/ { flush(); name = $3; sc = gpu = cta = arv = wt = iv = sy = st = 0; next }
    /MEMBAR\.SC\.GPU/ { ++sc }
    /MEMBAR\.ALL\.GPU/ { ++gpu }
    /MEMBAR\.ALL\.CTA/ { ++cta }
    /UCGABAR_ARV/ { ++arv }
    /UCGABAR_WAIT/ { ++wt }
    /CCTL\.IVALL/ { ++iv }
    /SYNCS\./ { ++sy }
    /[^A-Z]STAS / { ++st }
    END { flush() }' | sort -k9
} | tee "$report"
