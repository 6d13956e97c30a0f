#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (apt only), then configures and builds Tandem.
# Idempotent: packages already present are not reinstalled; the build is incremental.
#
#   BUILD_DIR   build directory (default: build)
#   BUILD_TYPE  CMake build type (default: RelWithDebInfo)
#   TANDEM_CMAKE_ARGS  extra arguments for cmake's configure step
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build_dir=${BUILD_DIR:-build}
build_type=${BUILD_TYPE:-RelWithDebInfo}

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libboost-dev libnuma-dev libgtest-dev libgmock-dev nlohmann-json3-dev
  python3 python3-grpcio python3-protobuf
  clang libclang-rt-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# nvcc is optional: the CUDA backend builds when a toolkit is installed in the usual place.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

jobs=${TANDEM_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" ${TANDEM_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"
echo "setup: build ready in $build_dir"
