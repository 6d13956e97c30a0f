#!/usr/bin/env bash
# On the GPU machine, after bench_80b.sh made the model: a CUPTI kernel timeline of 32 graph-replayed
# batch-1 decode steps and one 512-token prefill (tests/gpu_backend/gpu_backend_timeline.cc): per
# step the wall time, the time when no kernel runs, the critical path by kernel, the gaps between
# dependent kernels (negative under PDL) and the side-stream joins, one representative layer of
# each kind; the step time untraced and traced. Writes timeline_80b.txt (the summary) and
# timeline_80b_csv.tar.xz (timeline_records.csv: every record with its critical-path link;
# timeline_steps.csv; timeline_edges.csv: the graph's edges) under $OUT.
# If CUPTI reports no kernels from graph launches when tracing starts after the graph was captured,
# it runs again with tracing on from the start (--trace-from open); if the graph edge query hangs
# (the tool exits 3 after 180 s of warm-up), again without it (--edges off).
# Usage (device): scripts/device/timeline_80b.sh [extra gpu_backend_timeline flags]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
model=${MODEL:-$(model_dir)/q3n-80b.gguf}  # the one bench_80b.sh made
[ -f "$model" ] || model=/tmp/q3n-80b.gguf
txt=$out/timeline_80b.txt
echo "# timeline_80b $(date -u +%FT%TZ), commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown), model $model" | tee "$txt"
[ -f "$model" ] || { echo "timeline_80b: no model (run bench_80b.sh first)" | tee -a "$txt"; exit 1; }
timeout 240 "$bundle/tests/gpu_backend_timeline" --model "$model" --steps 32 --prefill 512 --out "$out/timeline_80b_csv" "$@" \
  >>"$txt" 2>&1
rc=$?
if [ $rc = 3 ] && grep -q "rerun with --edges off" "$txt"; then
  echo "# again with --edges off (joins inferred from times)" | tee -a "$txt"
  set -- --edges off "$@"
  timeout 240 "$bundle/tests/gpu_backend_timeline" --model "$model" --steps 32 --prefill 512 --out "$out/timeline_80b_csv" "$@" \
    >>"$txt" 2>&1
  rc=$?
fi
if grep -q "rerun with --trace-from open" "$txt"; then
  echo "# again with --trace-from open" | tee -a "$txt"
  timeout 240 "$bundle/tests/gpu_backend_timeline" --model "$model" --steps 32 --prefill 512 --out "$out/timeline_80b_csv" \
    --trace-from open "$@" >>"$txt" 2>&1
  rc=$?
fi
(cd "$out" && [ -d timeline_80b_csv ] && tar -cJf timeline_80b_csv.tar.xz timeline_80b_csv && rm -rf timeline_80b_csv)
echo "timeline_80b: rc=$rc" >>"$txt"
exit $rc
