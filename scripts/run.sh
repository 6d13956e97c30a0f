#!/usr/bin/env bash
# The README's main command: builds if needed, generates the default `tiny` model if it is absent,
# starts tandem-gpu-service on 127.0.0.1 with one host expert worker (spawned by the service; the
# expert budget is half, so half of every layer's experts are computed by the worker), waits for
# SERVING, streams one generation through a real gRPC client (Python, python3-grpcio) printing the
# text as it arrives, then keeps serving until Ctrl-C.
#
#   scripts/run.sh [--once]     --once: exit after the demo (CI; free ports instead of the fixed ones)
#
#   BUILD_DIR     build directory (default: build)
#   MODEL         the model file (default: models/tiny.gguf, generated from the `tiny` preset)
#   PROMPT        the demo prompt
#   PORT          gRPC port (default 50051; 0 with --once)
#   METRICS_PORT  Prometheus /metrics port (default 9090; 0 with --once)
#   BUDGET        --gpu-expert-budget (default 0.5)
#   WORKERS       worker spec(s), space-separated (default: share=0/1,threads=1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
once=0
for arg in "$@"; do
  case "$arg" in
    --once) once=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
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
  echo "run: generating the default model $model (preset tiny)"
  "$tandem" gen-model --preset tiny --out "$model.tmp.$$" >/dev/null
  mv "$model.tmp.$$" "$model"
fi

# Python message classes for the client (protoc --python_out; no grpc_tools needed).
pb2="$build_dir/python"
proto=proto/tandem/v1/generation.proto
if [ ! -f "$pb2/tandem/v1/generation_pb2.py" ] || [ "$proto" -nt "$pb2/tandem/v1/generation_pb2.py" ]; then
  mkdir -p "$pb2"
  protoc -I proto --python_out="$pb2" "$proto"
fi

if [ "$once" = 1 ]; then port=${PORT:-0}; metrics_port=${METRICS_PORT:-0}; else
  port=${PORT:-50051}; metrics_port=${METRICS_PORT:-9090}; fi
workdir=$(mktemp -d "${TMPDIR:-/tmp}/tandem-run.XXXXXX")
worker_flags=()
for spec in ${WORKERS:-share=0/1,threads=1}; do worker_flags+=("--worker=$spec"); done
"$service" --model "$model" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics_port" \
  --gpu-expert-budget "${BUDGET:-0.5}" "${worker_flags[@]}" --worker-binary "$worker" \
  --ready-file "$workdir/ready" 2>"$workdir/service.log" &
service_pid=$!
stop() {
  if kill -0 "$service_pid" 2>/dev/null; then
    kill -TERM "$service_pid" 2>/dev/null || true
    wait "$service_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap stop EXIT
trap 'echo; echo "run: stopping (Ctrl-C)"; exit 0' INT TERM

echo "run: starting tandem-gpu-service (log: $workdir/service.log)"
for _ in $(seq 600); do
  [ -f "$workdir/ready" ] && break
  if ! kill -0 "$service_pid" 2>/dev/null; then
    echo "run: the service exited during start-up:" >&2
    cat "$workdir/service.log" >&2
    exit 1
  fi
  sleep 0.1
done
[ -f "$workdir/ready" ] || { echo "run: the service did not become ready" >&2; cat "$workdir/service.log" >&2; exit 1; }
port=$(sed -n 's/^grpc_port=//p' "$workdir/ready")
metrics_port=$(sed -n 's/^metrics_port=//p' "$workdir/ready")
target="127.0.0.1:$port"
/usr/bin/python3 scripts/tandem_client.py --pb2 "$pb2" health --target "$target" --wait 30
grep -h '"event":"worker_ready"\|"event":"expert_placement"' "$workdir/service.log" | sed 's/^/run: /'
echo "run: streaming from $target:"
/usr/bin/python3 scripts/tandem_client.py --pb2 "$pb2" stream --target "$target" -n 32 \
  --prompt "${PROMPT:-Tandem serves experts in tandem:}"
worker_rows=$(/usr/bin/python3 - "$metrics_port" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(next((l.split()[-1] for l in text.splitlines()
            if l.startswith('tandem:expert_rows_total{placement="worker"}')), "?"))
EOF
)
echo "run: expert rows computed by the worker so far: $worker_rows"
if [ "$once" = 1 ]; then
  exit 0
fi
cat <<EOF
run: serving tandem.v1.Generation on $target (metrics: http://127.0.0.1:$metrics_port/metrics)
     grpcurl -plaintext -d '{"input":{"text":"Hello"},"params":{"stopping":{"max_new_tokens":16}}}' \\
         $target tandem.v1.Generation/GenerateStream
     Ctrl-C stops the service and its worker.
EOF
wait "$service_pid"
