#!/usr/bin/env bash
# On the GPU machine, after bench_80b.sh made the model: every kernel of one batch-1 decode step
# (a CUDA graph replay) and of one 512-token prefill step, timed one by one by Nsight Compute
# (gpu__time_duration, clocks and caches left alone), from the NVTX ranges gpu_backend_bench puts
# around those steps. Kernels run serialized under ncu, so the sum of their times is the step's
# time without launch gaps or overlap; the graph's wall time minus that sum is what launches and
# dependencies cost (the bench adds those ranged steps with --nvtx). Writes profile_80b.txt (per kernel name: launches, total and mean us) and
# profile_80b.csv (ncu's raw rows) under $OUT.
# Usage (device): scripts/device/profile_80b.sh [extra gpu_backend_bench flags]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
model=${MODEL:-$(model_dir)/q3n-80b.gguf}  # the one bench_80b.sh made
[ -f "$model" ] || model=/tmp/q3n-80b.gguf
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "profile_80b: no ncu on this machine" | tee "$out/profile_80b.txt"; exit 1; }
timeout 400 "$ncu" --nvtx --nvtx-include "decode_b1/" --nvtx-include "prefill_512/" \
  --metrics gpu__time_duration.sum --csv --clock-control none --cache-control none \
  --kernel-name-base function --log-file "$out/profile_80b.csv" \
  "$bundle/tests/gpu_backend_bench" --model "$model" --batches 1 --prefill 512 --decode-steps 8 --nvtx "$@" \
  >"$out/profile_80b_bench.log" 2>&1
rc=$?
python3 - "$out/profile_80b.csv" >"$out/profile_80b.txt" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1000.0 if unit == "nsecond" or unit == "ns" else (v if unit in ("usecond", "us") else v * 1000.0)
    rows.append((int(r["ID"]), r["Kernel Name"], us, r.get("Grid Size", ""), r.get("Block Size", "")))
rows.sort()
# The decode step comes first; the prefill step starts at the second embedding gather.
emb = [i for i, r in enumerate(rows) if "Embedding" in r[1]]
cut = emb[1] if len(emb) > 1 else len(rows)
for name, part in (("decode batch 1 (one graph replay)", rows[:cut]), ("prefill 512", rows[cut:])):
    total = sum(r[2] for r in part)
    print(f"## {name}: {len(part)} kernels, {total:.1f} us summed")
    agg = collections.OrderedDict()
    for _, k, us, g, b in part:
        a = agg.setdefault(k, [0, 0.0, g, b])
        a[0] += 1
        a[1] += us
    print(f"{'kernel':60s} {'n':>5s} {'total us':>10s} {'mean us':>9s}  grid / block")
    for k, (n, t, g, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{k[:60]:60s} {n:5d} {t:10.1f} {t / n:9.2f}  {g} / {b}")
    print()
PY
echo "profile_80b: ncu rc=$rc" >>"$out/profile_80b.txt"
exit $rc
