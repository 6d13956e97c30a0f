#!/usr/bin/env bash
# On the GPU machine, after bench_80b.sh (or `tandem gen-model --preset q3n-80b`) made the model: one
# batch-1 decode step with its kernels stamped inside the step (`gpu_backend_bench
# --probe-step`, tests/gpu_backend/step_probe_report.h): the GDN layers' input product and
# fused GDN kernel, every layer's fused MoE kernel (routed and shared-expert blocks), and every
# attention layer's split attention and output product by columns, each phase's first, median and
# last block after the launch's first PDL wait return. The stamped kernels are separate
# instantiations, so the step runs a little slower than unprobed (the tok/s printed is the probed
# run's). Writes probe_80b.txt under $OUT; with BENCHES='LABEL:PATH ...' probes other builds'
# gpu_backend_bench too (each into probe_80b_LABEL.txt), e.g. the extra/ benches of a bundle.
# Usage (device): scripts/device/probe_80b.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
model=${MODEL:-$(model_dir)/q3n-80b.gguf}  # the one bench_80b.sh made
[ -f "$model" ] || model=/tmp/q3n-80b.gguf
probe() {  # label bench txt
  local label=$1 bench=$2 txt=$3
  echo "# probe_80b $label $(date -u +%FT%TZ), commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown), model $model" |
    tee "$txt"
  [ -f "$model" ] || { echo "probe_80b: no model (run bench_80b.sh first)" | tee -a "$txt"; return 1; }
  [ -x "$bench" ] || { echo "probe_80b: no $bench" | tee -a "$txt"; return 1; }
  timeout 180 "$bench" --model "$model" --batches 1 --prefill 512 --decode-steps 32 --probe-step >>"$txt" 2>&1
  local rc=$?
  echo "probe_80b $label: rc=$rc" >>"$txt"
  return $rc
}
probe main "$bundle/tests/gpu_backend_bench" "$out/probe_80b.txt"
rc=$?
for b in ${BENCHES:-}; do
  probe "${b%%:*}" "${b#*:}" "$out/probe_80b_${b%%:*}.txt" || rc=$?
done
exit $rc
