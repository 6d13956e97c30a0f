#!/usr/bin/env bash
# On the GPU machine: the first end-to-end look at the pick prediction (PickPrediction,
# gpu_service/backends/cuda/backend/moe_stage.h: the ffn norm guesses a layer's picks before its
# wait, the fused MoE kernel copies the guesses' gate/up rows while it routes). In one call, in
# this order, each stage skipped once the deadline is near:
#   1. one probed batch-1 step with TANDEM_NORM_PREDICT=10 (does the path run, and how often was a
#      guess the pick its blocks served: the "speculative copies" line) and one without;
#   2. ab_80b.sh over main's path twice (the second a noise control: the same code path) and the
#      prediction: 10 guesses (copies only) and 20 (10 more into L2), 20 in GDN layers only, 20
#      with the guesses' down rows into L2 too, and 13, 20 and 30 with 13 pick groups (13 guesses
#      copied, the rest into L2); as many rounds as leave 150 s for
#   3. its tests: served_pick_test, gpu_moe_kernels_test's prediction and fused-kernel tests,
#      gpu_kernels_test's norm-route tests, gpu_backend_test's prediction tests (on `small`: the
#      path runs, its guesses hold the picks, the logits stay as without it);
#   4. gpu_backend_test with TANDEM_NORM_PREDICT=20 (logits and picks as without it).
# Writes predict_80b.txt (the summary) and the stages' logs under $OUT.
# Usage (device): scripts/device/predict_80b.sh [--deadline SECONDS] (default 560: a call's limit
# is 600 s)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
deadline=560
while [ $# -gt 0 ]; do
  case "$1" in
    --deadline) deadline=$2; shift 2 ;;
    *) echo "predict_80b: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$deadline" in ''|*[!0-9]*) echo "predict_80b: --deadline must be whole seconds, not '$deadline'" >&2; exit 2 ;; esac
report=$out/predict_80b.txt
echo "# predict_80b $(date -u +%FT%TZ), commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)" | tee "$report"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$report"
left() { echo $((deadline - SECONDS)); }
note() { echo "$*" | tee -a "$report"; }
rc=0

# The tests (stage 3; a GPU test skips with a message where no GPU is seen: count the skips too).
gtest() {  # name binary filter
  local name=$1 bin=$bundle/tests/$2 filter=$3
  [ -x "$bin" ] || { note "$name: no $bin"; rc=1; return; }
  local limit=$(( $(left) - 5 ))
  [ "$limit" -le 150 ] || limit=150
  [ "$limit" -gt 10 ] || { note "$name: skipped (deadline)"; rc=1; return; }
  timeout "$limit" "$bin" ${filter:+--gtest_filter="$filter"} >"$out/$name.log" 2>&1
  local r=$?
  # A test's own line ends with its time; gtest's summary lists failed and skipped tests again.
  note "$name: rc=$r, $(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$out/$name.log") passed, $(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$out/$name.log") failed, $(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$out/$name.log") skipped"
  grep -E '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$out/$name.log" | head -20 | tee -a "$report"
  [ $r -eq 0 ] || rc=1
}

# The model (bench_80b.sh's, else a new one).
dir=${MODEL_DIR:-$(model_dir)}
model=$dir/q3n-80b.gguf
if [ ! -f "$model" ]; then
  "$bundle/bin/tandem" gen-model --preset q3n-80b --out "$model" --threads "$(nproc)" 2>&1 | tail -1 | tee -a "$report"
fi
bench=$bundle/tests/gpu_backend_bench

# 1. The probed steps: with a prediction first (the line that says the path ran), then main's. A
# run's seconds (the model's load included) size the A/B below.
run_s=30
for form in p10:10 off:0; do
  label=${form%%:*}
  [ "$(left)" -gt 60 ] || { note "probe $label: skipped (deadline)"; continue; }
  start=$SECONDS
  TANDEM_NORM_PREDICT=${form#*:} timeout 120 "$bench" --model "$model" --batches 1 --prefill 512 --decode-steps 32 \
    --probe-step >"$out/probe_$label.txt" 2>&1
  r=$?
  run_s=$((SECONDS - start + 2))
  note "probe $label: rc=$r (${run_s}s with the model's load)"
  [ $r -eq 0 ] || rc=1
  grep -E '^decode batch|speculative copies|^MoE kernel probe' "$out/probe_$label.txt" | sed 's/^/  /' | tee -a "$report"
  if [ "$label" != off ] && ! grep -q 'speculative copies' "$out/probe_$label.txt"; then
    note "  PATH DID NOT RUN: no routed block of the probed step copied a guess (the A/B's p rows measure main's path)"
    rc=1
  fi
  grep -E '^  routed +(PDL wait|picked|routed|gate/up|act|cluster|down|exit)' "$out/probe_$label.txt" | sed 's/^/  /' |
    tee -a "$report"
done

# 2. The A/B: one process a run, configurations interleaved round by round; as many rounds (up to
# three) as the time left holds at the probes' seconds a run, keeping 150 s for the tests.
configs=('off:' 'off2:TANDEM_NORM_PREDICT=0' 'p10:TANDEM_NORM_PREDICT=10' 'p20:TANDEM_NORM_PREDICT=20'
  'p20g:TANDEM_NORM_PREDICT=20 TANDEM_NORM_PREDICT_LAYERS=gdn' 'p20d:TANDEM_NORM_PREDICT=20 TANDEM_NORM_PREDICT_DOWN=1'
  'p13x13:TANDEM_NORM_PREDICT=13 TANDEM_NORM_PREDICT_GROUPS=13'
  'p20x13:TANDEM_NORM_PREDICT=20 TANDEM_NORM_PREDICT_GROUPS=13'
  'p30x13:TANDEM_NORM_PREDICT=30 TANDEM_NORM_PREDICT_GROUPS=13')
rounds=$(( ($(left) - 150) / (run_s * ${#configs[@]}) ))
[ "$rounds" -le 3 ] || rounds=3
if [ "$rounds" -ge 1 ]; then
  OUT=$out BUNDLE=$bundle MODEL_DIR=$dir timeout $(( $(left) - 20 )) bash "$root/scripts/device/ab_80b.sh" --rounds $rounds \
    --bench "--batches 1 --prefill 512 --decode-steps 32" "${configs[@]}" >"$out/ab_80b.log" 2>&1
  note "ab_80b: rc=$? ($rounds rounds at ~${run_s}s a run)"
  sed -n '/median/,$p' "$out/ab_80b.txt" | tee -a "$report"
else
  note "ab_80b: skipped (deadline: ${run_s}s a run)"
fi

# 3. The kernel and backend tests of the prediction.
gtest served_pick served_pick_test ""
gtest moe_predict gpu_moe_kernels_test '*Predict*:OneTokenFused*'
gtest norm_route gpu_kernels_test '*NormRoute*:*RouteCompose*'
gtest backend_predict gpu_backend_test '*PickPrediction*'

# 4. The backend's decode tests with the prediction on.
if [ "$(left)" -gt 90 ]; then
  TANDEM_NORM_PREDICT=20 timeout $(( $(left) - 10 )) "$bundle/tests/gpu_backend_test" >"$out/backend_p20.log" 2>&1
  r=$?
  note "gpu_backend_test (TANDEM_NORM_PREDICT=20): rc=$r, $(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$out/backend_p20.log") passed, $(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$out/backend_p20.log") skipped"
  grep -E '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$out/backend_p20.log" | head -20 | tee -a "$report"
  [ $r -eq 0 ] || rc=1
else
  note "gpu_backend_test: skipped (deadline)"
fi
note "predict_80b: rc=$rc after ${SECONDS}s"
exit $rc
