# Sourced by the device scripts (run_all.sh, bench_80b.sh, ab_80b.sh, profile_80b.sh, timeline_80b.sh,
# probe_80b.sh): the repository root (made the working directory), the bundle
# (BUNDLE, default .device-bundle), the output folder (OUT, default device-out; created), the
# bundle's libraries on the loader path, and where the q3n-80b model is or a new one goes.
# TANDEM_REQUIRE_GPU=TEXT (say H200): the script stops at once, with status 3, unless the first
# GPU's name contains TEXT, so that a call meant for one card ends in seconds when another is lent.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
bundle=${BUNDLE:-$root/.device-bundle}
out=${OUT:-$root/device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}

# The first GPU's name (empty when nvidia-smi cannot tell).
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1; }

if [ -n "${TANDEM_REQUIRE_GPU:-}" ]; then
  gpu_name=$(gpu_name)
  case "$gpu_name" in
    *"$TANDEM_REQUIRE_GPU"*) ;;
    *) echo "$(basename "$0"): the GPU is '${gpu_name:-none found}', not the $TANDEM_REQUIRE_GPU that TANDEM_REQUIRE_GPU asks for; stopping" >&2
       exit 3 ;;
  esac
fi

# GB free in /dev/shm (empty when df cannot tell).
shm_free_gb() { df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9; }

# The folder for a new q3n-80b.gguf (47 GB): /dev/shm when it has 52 GB free, else /tmp.
new_model_dir() {
  if [ "$(shm_free_gb)" -ge 52 ] 2>/dev/null; then echo /dev/shm; else echo /tmp; fi
}

# The folder of the q3n-80b.gguf an earlier script made (/dev/shm, else /tmp), else new_model_dir's.
model_dir() {
  if [ -f /dev/shm/q3n-80b.gguf ]; then echo /dev/shm
  elif [ -f /tmp/q3n-80b.gguf ]; then echo /tmp
  else new_model_dir
  fi
}
