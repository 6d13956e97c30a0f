#!/usr/bin/env bash
# Builds the GGUF reader fuzzer with clang (ASan + UBSan + libFuzzer) in its own build directory,
# seeds a corpus from small valid files written by GgufWriter, and fuzzes for a bounded time.
#
#   scripts/fuzz.sh [SECONDS]     default 300; uses one core
#   FUZZ_BUILD_DIR                build directory (default: build-fuzz)
#
# The corpus grows in $FUZZ_BUILD_DIR/fuzz-corpus/gguf_reader across runs; a crashing input is
# saved under $FUZZ_BUILD_DIR/fuzz-artifacts/ and the script exits non-zero. The last line is the
# summary: duration, executions, corpus size, result.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-300}
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
case "$build" in /*) ;; *) build=$root/$build ;; esac

mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTANDEM_BUILD_FUZZERS=ON -DTANDEM_ENABLE_CUDA=OFF -DTANDEM_BUILD_TESTS=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
ninja -C "$build" -j "${TANDEM_JOBS:-2}" gguf_reader_fuzz gguf_fuzz_seeds

corpus=$build/fuzz-corpus/gguf_reader
seeds=$build/fuzz-seeds
artifacts=$build/fuzz-artifacts/
rm -rf "$seeds"
mkdir -p "$corpus" "$seeds" "$artifacts"
"$build/fuzz/gguf_fuzz_seeds" "$seeds"

log=$build/fuzz-gguf_reader.log
set +e
# -malloc_limit_mb: no input of a few KB may need a large allocation (a lying count would).
"$build/fuzz/gguf_reader_fuzz" "$corpus" "$seeds" \
  -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -dict="$root/fuzz/gguf.dict" -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1
rc=$?
set -e
tail -n 30 "$log"
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
corpus_size=$(find "$corpus" -type f | wc -l)
if [ "$rc" -eq 0 ]; then
  result="no findings"
else
  result="FAILED (exit $rc; artifacts in $artifacts; log $log)"
fi
echo "fuzz gguf_reader: ${seconds}s, ${execs} executions, corpus ${corpus_size} files, result: ${result}"
exit "$rc"
