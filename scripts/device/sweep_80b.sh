#!/usr/bin/env bash
# On the GPU machine: the batch-1 decode path's A/B switches, each turned to its other value one at
# a time, against the defaults (scripts/device/ab_80b.sh: one gpu_backend_bench process per
# configuration and round, interleaved), then each configuration's median against the defaults'.
# Why: every default was chosen by an A/B on the code and the card of its day; later changes to
# the kernels around it can turn the choice (the fiftieth session found the fused MoE kernel's
# routing warp by slot 1.5% behind warp 0 on an H100). Name the card when quoting the figures.
# Writes ab_80b.txt (ab_80b.sh's report) and sweep_80b.txt under $OUT.
# Usage (device): scripts/device/sweep_80b.sh [ab_80b.sh's options and LABEL:ASSIGNMENTS ...]
#   (passed on after this script's defaults: --rounds 2 --bench "--batches 1 --prefill 512
#   --decode-steps 128"; ~13 configurations of ~13 s each a round on q3n-80b)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
# label:the other value of one switch (the defaults' comments in the code say what each does).
configs=(
  'defaults:'
  'pick-warp-by-slot:TANDEM_FUSED_PICK_BY_SLOT=1'
  'attn-kv-stacked:TANDEM_ATTN_DECODE_KV_SIDE=0'
  'attn-merge-launch:TANDEM_ATTN_MERGE_IN_OUT=0'
  'attn-split-always:TANDEM_ATTN_SHORT_KEYS=0'
  'gdn-z-stacked:TANDEM_GDN_DECODE_Z_SIDE=0'
  'gdn-out-no-bulk:TANDEM_GDN_OUT_BULK=0'
  'gdn-out-two-barriers:TANDEM_GDN_OUT_ONE_BARRIER=0'
  'gdn-rows-not-polled:TANDEM_GDN_ROWS_POLLED=0'
  'moe-x-after-wait:TANDEM_ONE_TOKEN_X_EARLY=0'
  'norm-h-after-wait:TANDEM_OLD_NORM_EARLY_H=1'
  'gdn-state-after-wait:TANDEM_OLD_GDN_EARLY_STATE=1'
  'head-f32:TANDEM_HEAD_INT16=0'
)
bash "$(dirname "$0")/ab_80b.sh" --rounds 2 --bench "--batches 1 --prefill 512 --decode-steps 128" "$@" \
  "${configs[@]}" > /dev/null 2>&1
report=$out/sweep_80b.txt
{
  # ab_80b.txt: its header (commit, flags), "LABEL round R: ..." per run, then the summary's lines
  # of label, case and median tokens/s.
  head -1 "$out/ab_80b.txt" | sed 's/^# ab_80b/# sweep_80b/'
  gpu_name
  awk '/^## median/ { summary = 1; next }
       !summary && $2 == "round" && !($1 in seen) { seen[$1] = 1; order[++n] = $1 }
       summary && $2 == "decode" && $3 == "batch" && $4 == "1" { v[$1] = $5 }
       END {
         if (!("defaults" in v) || v["defaults"] <= 0) { print "sweep_80b: no result for the defaults"; exit 1 }
         printf "%-24s %10s %12s\n", "configuration", "b1 tok/s", "vs defaults"
         for (i = 1; i <= n; ++i) {
           if (order[i] in v) printf "%-24s %10.1f %+11.1f%%\n", order[i], v[order[i]], 100 * (v[order[i]] / v["defaults"] - 1)
           else printf "%-24s %10s\n", order[i], "no result (the bench failed: ab_80b.txt)"
         }
       }' "$out/ab_80b.txt"
} | tee "$report"
