#!/usr/bin/env bash
# On the GPU machine: A/B of environment switches end to end on q3n-80b (the model bench_80b.sh
# makes; generated here if missing). Runs gpu_backend_bench once per configuration and round,
# configurations interleaved round by round (A B A B ...) so that drift hits them alike, and prints
# one line per run plus a summary (median over rounds) of tokens/s per case. Writes ab_80b.txt
# under $OUT.
# Usage (device):
#   scripts/device/ab_80b.sh [--rounds N] [--bench "gpu_backend_bench flags"] 'LABEL:VAR=V VAR2=V' ...
# A configuration is a label, a colon and the environment assignments for that run ('new:' runs
# with none). Default bench flags: --batches 1,8 --prefill 512 --decode-steps 64. The assignment
# AB_BIN=PATH runs that gpu_backend_bench instead of the bundle's (A/B of two builds in one call).
# Example: scripts/device/ab_80b.sh --rounds 2 'new:' 'old-join:TANDEM_OLD_DOWN_JOIN=1'
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
rounds=1
bench_flags="--batches 1,8 --prefill 512 --decode-steps 64"
configs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --bench) bench_flags=$2; shift 2 ;;
    *:*) configs+=("$1"); shift ;;
    *) echo "ab_80b: '$1' is neither an option nor LABEL:ASSIGNMENTS" >&2; exit 2 ;;
  esac
done
if [ ${#configs[@]} -eq 0 ]; then
  echo "ab_80b: no configurations given (e.g. 'new:' 'old:TANDEM_OLD_DOWN_JOIN=1')" >&2
  exit 2
fi
case "$rounds" in ''|*[!0-9]*|0) echo "ab_80b: --rounds must be a positive integer, not '$rounds'" >&2; exit 2 ;; esac
# The model bench_80b.sh made (in /dev/shm, or /tmp when /dev/shm lacked room), else a new one.
dir=${MODEL_DIR:-$(model_dir)}
model=$dir/q3n-80b.gguf
report=$out/ab_80b.txt
echo "# ab_80b $(date -u +%FT%TZ), commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown), flags: $bench_flags" | tee "$report"
if [ ! -f "$model" ]; then
  "$bundle/bin/tandem" gen-model --preset q3n-80b --out "$model" --threads "$(nproc)" 2>&1 | tail -1 | tee -a "$report"
fi
results=$(mktemp)
for ((r = 1; r <= rounds; ++r)); do
  for c in "${configs[@]}"; do
    label=${c%%:*}
    assignments=${c#*:}
    bin=$bundle/tests/gpu_backend_bench
    env_assignments=""  # the environment of the run: the assignments but AB_BIN
    for a in $assignments; do
      case $a in
        AB_BIN=*) bin=${a#AB_BIN=} ;;
        *) env_assignments="$env_assignments $a" ;;
      esac
    done
    # shellcheck disable=SC2086  # the assignments and flags are word lists on purpose
    run_log=$(env $env_assignments "$bin" --model "$model" $bench_flags 2>&1)
    lines=$(grep -E '^(decode batch|prefill) ' <<< "$run_log")
    if [ -z "$lines" ]; then
      # What the bench said last (its error), so that a failing configuration can be diagnosed.
      echo "$label round $r: no result (the bench failed); its last lines:" | tee -a "$report"
      tail -n 5 <<< "$run_log" | sed 's/^/  | /' | tee -a "$report"
      continue
    fi
    while IFS= read -r line; do
      case_name=$(echo "$line" | sed -E 's/^(decode batch +[0-9]+|prefill +[0-9]+):.*/\1/' | tr -s ' ')
      tps=$(echo "$line" | sed -E 's/^[^:]*: +([0-9.]+) tokens\/s.*/\1/')
      echo "$label round $r: $case_name $tps tok/s" | tee -a "$report"
      echo "$label|$case_name|$tps" >> "$results"
    done <<< "$lines"
  done
done
echo "## median tokens/s over $rounds round(s)" | tee -a "$report"
awk -F'|' '{ k = $1 "|" $2; v[k] = v[k] " " $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k } }
  END {
    for (i = 1; i <= n; ++i) {
      k = order[i]; m = split(substr(v[k], 2), a, " ");
      for (x = 1; x <= m; ++x) for (y = x + 1; y <= m; ++y) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
      split(k, p, "|"); printf "%-24s %-18s %10.1f\n", p[1], p[2], a[int((m + 1) / 2)]
    }
  }' "$results" | tee -a "$report"
rm -f "$results"
