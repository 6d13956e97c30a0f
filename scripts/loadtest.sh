#!/usr/bin/env bash
# Load test over loopback: starts tandem-gpu-service (with one spawned host worker at half the
# expert budget, as scripts/run.sh does) on a free 127.0.0.1 port, runs scripts/loadtest.py
# against it, and stops it. Bounded: every level stops after --requests requests or --seconds.
#
#   scripts/loadtest.sh                       sweep concurrency 1,2,4,8,16,32,64
#   scripts/loadtest.sh --soak MINUTES        concurrency 16 for MINUTES; RSS every 10 s
#   scripts/loadtest.sh -- ARGS...            extra loadtest.py arguments (--requests, --seconds,
#                                             --max-new-tokens, --concurrency LIST)
#
#   BUILD_DIR  build directory (default: build)   MODEL  (default: models/tiny.gguf)
#   BUDGET     --gpu-expert-budget (default 0.5)  WORKERS  worker specs (default: share=0/1,threads=1)
#   SERVICE_ARGS  extra tandem-gpu-service flags (default: --max-running=64 --max-queue=256)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --soak) extra+=(--soak "$2"); shift 2 ;;
    --) shift; extra+=("$@"); break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "loadtest.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

build_dir=${BUILD_DIR:-build}
service="$build_dir/gpu_service/tandem-gpu-service"
worker="$build_dir/host_expert_worker/tandem-host-worker"
tandem="$build_dir/gpu_service/tandem"
model=${MODEL:-models/tiny.gguf}
if [ ! -x "$service" ] || [ ! -x "$worker" ] || { [ ! -f "$model" ] && [ ! -x "$tandem" ]; }; then
  "$root/scripts/setup.sh"
fi
if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  "$tandem" gen-model --preset tiny --out "$model.tmp.$$" >/dev/null
  mv "$model.tmp.$$" "$model"
fi
pb2="$build_dir/python"
proto=proto/tandem/v1/generation.proto
if [ ! -f "$pb2/tandem/v1/generation_pb2.py" ] || [ "$proto" -nt "$pb2/tandem/v1/generation_pb2.py" ]; then
  mkdir -p "$pb2"
  protoc -I proto --python_out="$pb2" "$proto"
fi

workdir=$(mktemp -d "${TMPDIR:-/tmp}/tandem-load.XXXXXX")
worker_flags=()
for spec in ${WORKERS:-share=0/1,threads=1}; do worker_flags+=("--worker=$spec"); done
# shellcheck disable=SC2086
"$service" --model "$model" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --gpu-expert-budget "${BUDGET:-0.5}" "${worker_flags[@]}" --worker-binary "$worker" \
  ${SERVICE_ARGS:---max-running=64 --max-queue=256} \
  --ready-file "$workdir/ready" 2>"$workdir/service.log" &
service_pid=$!
stop() {
  kill -TERM "$service_pid" 2>/dev/null || true
  wait "$service_pid" 2>/dev/null || true
  rm -rf "$workdir"
}
trap stop EXIT
for _ in $(seq 600); do
  [ -f "$workdir/ready" ] && break
  kill -0 "$service_pid" 2>/dev/null || { cat "$workdir/service.log" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/^grpc_port=//p' "$workdir/ready")
metrics_port=$(sed -n 's/^metrics_port=//p' "$workdir/ready")
echo "loadtest: service pid $service_pid on 127.0.0.1:$port ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
/usr/bin/python3 scripts/loadtest.py --pb2 "$pb2" --target "127.0.0.1:$port" \
  --service-pid "$service_pid" "${extra[@]}"
rc=$?
# The service's own count of finished requests, by stop reason, and its worker rows.
/usr/bin/python3 - "$metrics_port" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for l in text.splitlines():
    if l.startswith(("tandem:request_success_total", "tandem:expert_rows_total",
                     "tandem:request_rejected_total")):
        print("loadtest: service metric", l)
EOF
exit "$rc"
