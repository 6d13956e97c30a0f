#!/usr/bin/env bash
# The README's main command. Until the gRPC service lands (issue 7) the main job is: build, generate
# the default `tiny` model if it is absent, inspect it, and generate text from it offline on the
# CPU reference engine.
#
#   MODEL   the model file (default: models/tiny.gguf, generated from the `tiny` preset)
#   PROMPT  the prompt (default: a short sentence)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
build_dir=${BUILD_DIR:-build}
tandem="$build_dir/gpu_service/tandem"
model=${MODEL:-models/tiny.gguf}
if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  echo "run: generating the default model $model (preset tiny)"
  "$tandem" gen-model --preset tiny --out "$model"
fi
"$tandem" inspect "$model" | head -n 60
echo "..."
"$tandem" generate --model "$model" --prompt "${PROMPT:-Tandem serves experts in tandem:}" -n 32
