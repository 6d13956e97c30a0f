#!/usr/bin/env bash
# On the GPU machine: every GPU test and benchmark in one call, with a text and JSON report under
# $OUT. Expects .device-bundle/ (made here by scripts/device/bundle.sh and carried):
#   bin/   tandem, tandem-host-worker, tandem-gpu-service
#   tests/ the test binaries (GPU suites among them)
#   lib/   the shared libraries Ubuntu 24.04 lacks
#   tests/ also the GPU micro-benchmarks (gpu_kernels_bench, prefill_stages_bench, gpu_moe_bench,
#          gpu_backend_profile)
# Usage (device): scripts/device/run_all.sh [--no-parity] [--no-bench] [--no-gpu-bench] [--bench-80b] [--profile-80b]
#                 [--timeline-80b] [--probe-80b]
#   --bench-80b also runs scripts/device/bench_80b.sh (q3n-80b decode/prefill against its floors).
#   --profile-80b then times every kernel of a batch-1 decode step and a 512-token prefill under
#   Nsight Compute (scripts/device/profile_80b.sh; needs the model bench_80b.sh made).
#   --timeline-80b: a CUPTI kernel timeline of graph-replayed batch-1 decode steps and a 512-token
#   prefill on that model (scripts/device/timeline_80b.sh: timeline_80b.txt, timeline_80b_csv.tar.xz).
#   --probe-80b: one batch-1 decode step with its kernels stamped inside it (scripts/device/probe_80b.sh:
#   probe_80b.txt, each phase of the GDN, MoE and attention kernels after their launch's wait).
#   FILTER_<suite>='gtest filter' runs only part of that suite (e.g. FILTER_gpu_moe_kernels_test='*Shared*').
#   SANITIZE=1 adds a compute-sanitizer memcheck pass over part of gpu_kernels_test.
#   AB_80B='LABEL:VAR=V ...;LABEL2:...' then runs scripts/device/ab_80b.sh over those configurations
#   (AB_ROUNDS rounds, default 2): environment switches A/B'd end to end on the same model.
#   AB_BENCH replaces ab_80b.sh's gpu_backend_bench flags.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
report=$out/report.txt
json=$out/report.json
: >"$report"
declare -a results=()
note() { echo "$*" | tee -a "$report"; }

note "# Tandem device run, $(date -u +%FT%TZ)"
note "commit: $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$report"
note "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

run_suite() {  # name binary
  local name=$1 bin=$2
  [ -x "$bin" ] || { note "$name: missing ($bin)"; results+=("\"$name\":\"missing\""); return; }
  local filter_var="FILTER_$name" filter=""
  filter=${!filter_var:-}
  "$bin" --gtest_output=json:"$out/$name.json" ${filter:+--gtest_filter="$filter"} >"$out/$name.log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E '^\[  (PASSED|FAILED)  \]|tests? from .* ran' "$out/$name.log" | tr '\n' ' ')
  note "$name: rc=$rc $summary"
  results+=("\"$name\":$rc")
}

for t in gpu_kernels_test gpu_moe_kernels_test gpu_backend_test; do
  run_suite "$t" "$bundle/tests/$t"
done

# The service on the CUDA backend: its integration tests, with the service binary found through a
# build-tree stand-in (TANDEM_TEST_BINARY_DIR: gpu_service/tandem-gpu-service and tests/service/).
if [ -x "$bundle/tests/service_integration_test" ] && [ -x "$bundle/bin/tandem-gpu-service" ]; then
  stand_in=$(mktemp -d)
  mkdir -p "$stand_in/gpu_service" "$stand_in/tests/service"
  ln -s "$bundle/bin/tandem-gpu-service" "$stand_in/gpu_service/tandem-gpu-service"
  TANDEM_TEST_BINARY_DIR=$stand_in TANDEM_TEST_BACKEND=cuda run_suite service_integration_test_cuda \
    "$bundle/tests/service_integration_test"
fi

if [[ " $* " != *" --no-gpu-bench "* ]]; then
  # The GPU micro-benchmarks (kernel families and the CUDA backend's per-stage profile).
  export TANDEM_GPU_BACKEND_MODELS=${TANDEM_GPU_BACKEND_MODELS:-/tmp/tandem-gpu-backend-models}
  for b in "gpu_kernels_bench --json=$out/gpu_kernels_bench.json" prefill_stages_bench gpu_moe_bench \
           "gpu_backend_profile tiny small"; do
    name=${b%% *}
    [ -x "$bundle/tests/$name" ] || { note "$name: missing"; continue; }
    # shellcheck disable=SC2086
    timeout 240 "$bundle/tests/"$b >"$out/$name.log" 2>&1
    rc=$?
    note "$name: rc=$rc"
    tail -n 25 "$out/$name.log" | tee -a "$report"
    results+=("\"$name\":$rc")
  done
  if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    timeout 120 compute-sanitizer --tool memcheck --print-limit 20 "$bundle/tests/gpu_kernels_test" \
      --gtest_filter='*Attention*/0:*Gdn*/0:*Streams*:*Sampling*:*/q4_K:*/q6_K:*/q8_0' \
      >"$out/sanitizer.log" 2>&1
    note "compute-sanitizer memcheck: rc=$? $(grep -m1 'ERROR SUMMARY' "$out/sanitizer.log")"
  fi
fi

if [[ " $* " != *" --no-parity "* ]]; then
  # llama.cpp's own converter, when a copy of it was carried (.llama-convert: convert_hf_to_gguf.py,
  # conversion/ and gguf-py/ from a llama.cpp source tree; never committed).
  [ -f "$root/.llama-convert/convert_hf_to_gguf.py" ] && export LLAMA_CPP_DIR=$root/.llama-convert
  TANDEM_BIN=$bundle/bin/tandem OUT=$out timeout 330 bash scripts/device/parity/run.sh "$bundle" \
    >"$out/parity_run.log" 2>&1
  rc=$?
  note "parity: rc=$rc (details in parity/)"
  tail -n 30 "$out/parity_run.log" | tee -a "$report"
  results+=("\"parity\":$rc")
fi

if [[ " $* " != *" --no-bench "* ]]; then
  "$bundle/bin/tandem" bench worker --threads "$(nproc)" --worker "$bundle/bin/tandem-host-worker" \
    --json >"$out/bench_worker.json" 2>"$out/bench_worker.log"
  rc=$?
  note "bench worker: rc=$rc"
  tail -n 20 "$out/bench_worker.log" | tee -a "$report"
  results+=("\"bench_worker\":$rc")
fi

run_80b() {  # name pattern: scripts/device/NAME.sh, then the lines of NAME.txt matching pattern
  local name=$1 pattern=$2
  OUT=$out BUNDLE=$bundle bash "$root/scripts/device/$name.sh" >"$out/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc"
  grep -E "$pattern" "$out/$name.txt" | tee -a "$report"
  results+=("\"$name\":$rc")
}
# The issue's end-to-end benchmark on q3n-80b shapes (generates the 47 GB model first), then the
# per-kernel profile over the same model.
[[ " $* " == *" --bench-80b "* ]] && run_80b bench_80b "^(ceilings|model|decode|prefill|  profile)"
[[ " $* " == *" --profile-80b "* ]] && run_80b profile_80b "^## "
[[ " $* " == *" --timeline-80b "* ]] && run_80b timeline_80b "^(## |decode batch|prefill [0-9]|cupti:|  mean|no kernel)"
[[ " $* " == *" --probe-80b "* ]] && run_80b probe_80b "^(decode batch|[A-Za-z].* probe|  )"
if [ -n "${AB_80B:-}" ]; then
  IFS=';' read -ra ab_configs <<<"$AB_80B"
  OUT=$out BUNDLE=$bundle bash "$root/scripts/device/ab_80b.sh" --rounds "${AB_ROUNDS:-2}" \
    ${AB_BENCH:+--bench "$AB_BENCH"} "${ab_configs[@]}" \
    >"$out/ab_80b.log" 2>&1
  rc=$?
  note "ab_80b: rc=$rc"
  sed -n '/^## median/,$p' "$out/ab_80b.txt" | tee -a "$report"
  results+=("\"ab_80b\":$rc")
fi

(IFS=,; echo "{${results[*]}}") >"$json"
note "summary: $(cat "$json")"
# Only 8 files come back from a device call: the reports stay as they are (report.txt / .json,
# bench_80b.txt / .json, profile_80b.txt, timeline_80b.txt and its csv archive, ab_80b.txt,
# probe_80b.txt), every log goes into one archive (logs.tar.xz).
(cd "$out" && find . -maxdepth 1 -type f ! -name 'report.*' ! -name bench_80b.txt ! -name bench_80b.json \
  ! -name profile_80b.txt ! -name timeline_80b.txt ! -name timeline_80b_csv.tar.xz ! -name ab_80b.txt \
  ! -name probe_80b.txt \
  ! -name logs.tar.xz -printf '%f\n' | tar -cJf logs.tar.xz -T - --remove-files 2>/dev/null)
