#!/usr/bin/env bash
# Installs the Debian packages ddp needs that are missing (as root, or through sudo);
# otherwise prints the one apt-get line needed and fails. Sourced by run.sh and test.sh.
# Usage: ddp_install_deps [extra packages...]

ddp_install_deps() {
  local wanted=(cmake g++ make pkg-config libspdlog-dev libfmt-dev libcxxopts-dev libgtest-dev
                nlohmann-json3-dev zlib1g-dev libopenblas-dev dataset-fashion-mnist
                openmpi-bin libopenmpi-dev libgloo-dev "$@")
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps: not a Debian system; make sure these are installed: ${wanted[*]}" >&2
    return 0
  fi
  local missing=()
  local package
  for package in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo"
    else
      echo "deps: missing Debian packages; install them with:" >&2
      echo "  sudo apt-get install -y ${missing[*]}" >&2
      return 1
    fi
  fi
  echo "deps: installing ${missing[*]}"
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
}

# Configures (once) and builds into build/ (or $DDP_BUILD_DIR), incrementally.
ddp_build() {
  local root build
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  build="${DDP_BUILD_DIR:-$root/build}"
  # The CUDA toolkit is not always on PATH (e.g. /usr/local/cuda); CMake finds it via CUDACXX.
  if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${DDP_CMAKE_ARGS:-} || return 1
  fi
  cmake --build "$build" -j "$(nproc)"
}
