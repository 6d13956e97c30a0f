#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test with ctest.
# GPU tests skip with a message when no GPU is present (scripts/device/ runs them on a GPU machine).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
build_dir=${BUILD_DIR:-build}
jobs=${TANDEM_JOBS:-$(nproc)}
set +e
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900 "$@" | tee "$build_dir/ctest.log"
rc=${PIPESTATUS[0]}
set -e
# Count by the status ctest prints after the name (names may contain these words too).
passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed +[0-9.]+ sec$' "$build_dir/ctest.log" || true)
failed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*(\*\*\*(Failed|Timeout|Exception)|\*\*\*Not Run|Not Run).*' "$build_dir/ctest.log" || true)
skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped +[0-9.]+ sec$' "$build_dir/ctest.log" || true)
echo "$passed passed, $failed failed, $skipped skipped"
exit "$rc"
