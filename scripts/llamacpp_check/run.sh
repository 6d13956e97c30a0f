#!/bin/bash
# Tandem vs llama.cpp (CPU, bundled by the npm package node-llama-cpp) on a Tandem-written
# tiny-q3n GGUF with F32 weights: greedy tokens (16 steps) and teacher-forced logits per position.
#
#   scripts/llamacpp_check/run.sh BUILD_DIR [WORK_DIR]
#
# BUILD_DIR holds gpu_service/tandem (with the gen-model and logits commands). node-llama-cpp is
# installed under WORK_DIR (default /tmp/tandem-llamacpp-check), never inside the repository.
set -euo pipefail
BUILD_DIR=$(realpath "${1:?usage: run.sh BUILD_DIR [WORK_DIR]}")
WORK=${2:-/tmp/tandem-llamacpp-check}
VERSION=${NODE_LLAMA_CPP_VERSION:-3.22.1}
HERE=$(cd "$(dirname "$0")" && pwd)
TANDEM=${TANDEM_BIN:-$BUILD_DIR/gpu_service/tandem}
mkdir -p "$WORK"
if [ ! -d "$WORK/node_modules/node-llama-cpp" ]; then
  (
    cd "$WORK"
    [ -f package.json ] || npm init -y >/dev/null
    npm install --no-audit --no-fund "node-llama-cpp@$VERSION" >/dev/null
  )
fi
cp "$HERE/compare.mjs" "$WORK/compare.mjs"
MODEL="$WORK/tiny-q3n-f32.gguf"
"$TANDEM" gen-model --preset tiny-q3n --experts-type f32 --dense-type f32 --head-type f32 \
  --out "$MODEL.tmp" --quiet && mv "$MODEL.tmp" "$MODEL"
echo "node $(node --version), node-llama-cpp $VERSION (llama.cpp $(node -e "console.log(require('$WORK/node_modules/node-llama-cpp/llama/llama.cpp.info.json').tag)"))"
cd "$WORK" && node compare.mjs --model "$MODEL" --tandem "$TANDEM" --steps "${STEPS:-16}" --out "$WORK/report.json"
