#!/bin/bash
# Parity checks on the GPU machine (PyTorch and transformers there; no network needed):
#   scripts/device/parity/run.sh BUILD_DIR
# BUILD_DIR holds gpu_service/tandem (built on the dev machine and carried). The report goes to
# $OUT/parity (or ./parity-out when OUT is unset). Optional: LLAMA_CPP_DIR=a llama.cpp source tree
# to compare with llama.cpp's own converter. Runs on the CPU (f32); about a minute.
set -euo pipefail
BUILD_DIR=$(realpath "${1:?usage: run.sh BUILD_DIR}")
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${OUT:-$PWD/parity-out}/parity
TANDEM=${TANDEM_BIN:-$BUILD_DIR/gpu_service/tandem}
mkdir -p "$DEST"
"$TANDEM" help 2>&1 | grep -q '^  logits' || { echo "run.sh: $TANDEM has no 'logits' command" >&2; exit 2; }
PY=${PYTHON:-python3}
echo "python: $($PY -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')"
CUDA_VISIBLE_DEVICES="" timeout 900 "$PY" "$HERE/parity.py" --tandem "$TANDEM" --out "$DEST" "${@:2}" 2>&1 | tee "$DEST/parity.log"
exit "${PIPESTATUS[0]}"
