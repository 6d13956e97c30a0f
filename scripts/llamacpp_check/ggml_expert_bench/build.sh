#!/bin/bash
# Builds ggml's CPU backend (llama.cpp as bundled by the npm package node-llama-cpp; CPU only,
# static, GGML_NATIVE off with the Zen 4 / Sapphire Rapids feature set: AVX-512 F/BW/VL/DQ/CD,
# VBMI, VNNI, BF16, so one binary runs on the dev box and the GPU machine) and links
# ggml_expert_bench.cc against it.
#
#   scripts/llamacpp_check/ggml_expert_bench/build.sh [WORK_DIR] [OUT_BINARY]
#
# WORK_DIR (default /tmp/tandem-ggml-expert-bench) receives the npm tarball, the llama.cpp clone
# and the ggml build; nothing of llama.cpp is written into the repository. OUT_BINARY defaults to
# WORK_DIR/ggml_expert_bench.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(realpath -m "${1:-/tmp/tandem-ggml-expert-bench}")
OUT=$(realpath -m "${2:-$WORK/ggml_expert_bench}")
VERSION=${NODE_LLAMA_CPP_VERSION:-3.22.1}
JOBS=${JOBS:-2}
mkdir -p "$WORK"
cd "$WORK"
if [ ! -d llama.cpp/ggml ]; then
  [ -f "node-llama-cpp-$VERSION.tgz" ] || npm pack --silent "node-llama-cpp@$VERSION" >/dev/null
  tar xzf "node-llama-cpp-$VERSION.tgz" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  git clone -q package/llama/gitRelease.bundle llama.cpp
fi
# OpenMP off: ggml's own persistent thread pool (ggml_threadpool_new), no libgomp to carry.
# GGML_CPU_REPACK on (the default): the program measures both weight layouts.
# llama.cpp's top-level project (the bundle lacks the files for configuring ggml alone), with
# everything but ggml switched off.
cmake -S llama.cpp -B ggml-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_STATIC=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=ON \
  -DGGML_CPU_REPACK=ON -DGGML_BACKEND_DL=OFF -DGGML_CCACHE=OFF \
  -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
  -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
ninja -C ggml-build -j"$JOBS" ggml-cpu ggml-base ggml >/dev/null
LIBS=$(find ggml-build -name 'libggml*.a' | sort)
g++ -std=c++17 -O2 -I llama.cpp/ggml/include "$HERE/ggml_expert_bench.cc" -o "$OUT" \
  -Wl,--start-group $LIBS -Wl,--end-group -lpthread -lm -static-libstdc++ -static-libgcc
echo "built $OUT (llama.cpp $(cd llama.cpp && git log -1 --format=%h) from node-llama-cpp $VERSION, tag $(grep -o '"tag": *"[^"]*"' package/llama/llama.cpp.info.json | cut -d'"' -f4))"
