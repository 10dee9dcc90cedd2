#!/usr/bin/env bash
# What ddp needs, checked by capability rather than by package name, and installed only where
# this machine allows it. Sourced by run.sh, test.sh and the benchmarks.
#
#   required: a C++17 compiler, CMake >= 3.24 (any origin: apt, pip, modules, conda), and the
#             libraries spdlog/fmt, cxxopts, nlohmann-json, zlib (+ GoogleTest for the tests);
#   optional: CUDA, NCCL, MPI, Gloo, OpenBLAS, the Fashion-MNIST dataset, matplotlib (plots).
#
# Where it can install (root, or sudo without a password, and apt-get reaching a mirror) it
# installs the Debian packages that are missing; an optional one that fails to install is
# left out, never fatal. Elsewhere (no root, no network, not Debian) it says what it would
# have installed and goes on: CMake then finds the libraries wherever they are
# (CMAKE_PREFIX_PATH, DDP_CMAKE_ARGS) and names a missing required one with the ways to
# provide it. DDP_NO_INSTALL=1 skips installing altogether.

DDP_MIN_CMAKE="3.24"
DDP_REQUIRED_PACKAGES=(g++ make libspdlog-dev libfmt-dev libcxxopts-dev nlohmann-json3-dev
                       zlib1g-dev)
DDP_TEST_PACKAGES=(libgtest-dev pkgconf doxygen)  # pkgconf: the pkg-config file is tested; doxygen: the API reference
# Optional for the tests only: a real one-node Slurm cluster (tests/slurm/slurm-test.sh).
DDP_OPTIONAL_TEST_PACKAGES=(slurm-wlm munge python3-torch python3-pip libtorch-dev)
DDP_OPTIONAL_PACKAGES=(libopenblas-dev openmpi-bin libopenmpi-dev libgloo-dev libmunge-dev
                       dataset-fashion-mnist python3-matplotlib)

ddp_log() { echo "deps: $*" >&2; }

# "3.25.1" >= "3.24"?
ddp_version_at_least() {
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]
}

# Tools that must be on PATH; prints what is wrong, returns 1 if any is missing.
# Packages that would provide a missing tool are appended to DDP_TOOL_PACKAGES.
ddp_check_tools() {
  DDP_TOOL_PACKAGES=()
  local ok=0
  if ! command -v "${CXX:-c++}" >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
    ddp_log "no C++ compiler (${CXX:-c++} or g++) on PATH"
    DDP_TOOL_PACKAGES+=(g++)
    ok=1
  fi
  local version=""
  if command -v cmake >/dev/null 2>&1; then
    version="$(cmake --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1)"
  fi
  if [ -z "$version" ]; then
    ddp_log "no cmake on PATH (need $DDP_MIN_CMAKE or newer; apt-get install cmake, or pip install cmake)"
    DDP_TOOL_PACKAGES+=(cmake)
    ok=1
  elif ! ddp_version_at_least "$version" "$DDP_MIN_CMAKE"; then
    ddp_log "cmake $version is older than $DDP_MIN_CMAKE (pip install --user cmake gives a newer one)"
    DDP_TOOL_PACKAGES+=(cmake)
    ok=1
  fi
  if ! command -v make >/dev/null 2>&1 && ! command -v ninja >/dev/null 2>&1; then
    ddp_log "no build tool (make or ninja) on PATH"
    DDP_TOOL_PACKAGES+=(make)
    ok=1
  fi
  return $ok
}

# The Debian packages of `wanted` that dpkg does not list as installed (none off Debian).
ddp_missing_packages() {
  command -v dpkg-query >/dev/null 2>&1 || return 0
  local package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      echo "$package"
  done
}

# How to run apt-get here: "" as root, "sudo" with passwordless sudo; returns 1 when
# nothing can be installed (and says why).
ddp_installer() {
  if [ "${DDP_NO_INSTALL:-0}" = "1" ]; then
    ddp_log "DDP_NO_INSTALL=1: installing nothing"
    return 1
  fi
  if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
    ddp_log "not a Debian/Ubuntu system (no apt-get): installing nothing"
    return 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    DDP_SUDO=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    DDP_SUDO="sudo"
  else
    ddp_log "not root and no passwordless sudo: installing nothing"
    return 1
  fi
  return 0
}

ddp_apt_install() {
  DEBIAN_FRONTEND=noninteractive $DDP_SUDO apt-get install -y -qq --no-install-recommends "$@" \
    >/dev/null 2>&1
}

# Usage: ddp_install_deps [--tests] [extra optional packages...]
# Returns non-zero only when a required tool (compiler, cmake, make) is still missing.
ddp_install_deps() {
  local with_tests=0
  if [ "${1:-}" = "--tests" ]; then
    with_tests=1
    shift
  fi
  local required=("${DDP_REQUIRED_PACKAGES[@]}")
  [ $with_tests -eq 1 ] && required+=("${DDP_TEST_PACKAGES[@]}")
  local optional=("${DDP_OPTIONAL_PACKAGES[@]}" "$@")
  [ $with_tests -eq 1 ] && optional+=("${DDP_OPTIONAL_TEST_PACKAGES[@]}")
  local tools_ok=0
  ddp_check_tools 2>/dev/null || tools_ok=1
  # A tool present in any form (a pip cmake, a module's compiler) is not asked of apt.
  local want_required=() package
  for package in "${required[@]}"; do
    case "$package" in
      g++ | make) [[ " ${DDP_TOOL_PACKAGES[*]:-} " == *" $package "* ]] && want_required+=("$package") ;;
      *) want_required+=("$package") ;;
    esac
  done
  [[ " ${DDP_TOOL_PACKAGES[*]:-} " == *" cmake "* ]] && want_required+=(cmake)
  local missing_required=() missing_optional=()
  mapfile -t missing_required < <(ddp_missing_packages "${want_required[@]}")
  mapfile -t missing_optional < <(ddp_missing_packages "${optional[@]}")
  if [ ${#missing_required[@]} -gt 0 ] || [ ${#missing_optional[@]} -gt 0 ]; then
    if ddp_installer; then
      if ! $DDP_SUDO apt-get update -qq >/dev/null 2>&1; then
        ddp_log "apt-get update failed (no network or no mirror): installing nothing"
      else
        if [ ${#missing_required[@]} -gt 0 ]; then
          ddp_log "installing ${missing_required[*]}"
          ddp_apt_install "${missing_required[@]}" ||
            ddp_log "could not install ${missing_required[*]}; CMake will say what is still missing"
        fi
        if [ ${#missing_optional[@]} -gt 0 ]; then
          ddp_log "installing (optional) ${missing_optional[*]}"
          if ! ddp_apt_install "${missing_optional[@]}"; then
            for package in "${missing_optional[@]}"; do
              ddp_apt_install "$package" || ddp_log "optional $package not installed: built without it"
            done
          fi
        fi
      fi
    else
      if [ ${#missing_required[@]} -gt 0 ]; then
        ddp_log "Debian packages not installed: ${missing_required[*]} (CMake looks for these libraries elsewhere too)"
      fi
      if [ ${#missing_optional[@]} -gt 0 ]; then
        ddp_log "optional, not installed: ${missing_optional[*]}"
      fi
      ddp_log "to install them: sudo apt-get install -y ${missing_required[*]} ${missing_optional[*]}"
    fi
  fi
  ddp_check_tools || return 1
  return 0
}

# Prints the first Python (python3 on PATH, then the system's /usr/bin/python3) that can
# import every module named; prints nothing and returns 1 when none can.
ddp_python_with() {
  local candidate module ok
  for candidate in python3 /usr/bin/python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    ok=1
    for module in "$@"; do
      "$candidate" -c "import $module" 2>/dev/null || { ok=0; break; }
    done
    if [ $ok -eq 1 ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# Python helpers for the tests that compare with PyTorch: Debian's python3-torch comes without
# safetensors, so pip puts it into BUILD/python (never into the system's Python), which those
# tests put on PYTHONPATH. Says why when it cannot (no Python with torch, no pip, no network);
# the tests that need it then skip, saying so.
ddp_python_test_deps() {
  local build="$1" py
  py="$(ddp_python_with torch numpy)" || {
    ddp_log "no Python with torch and numpy: the PyTorch comparisons skip"
    return 0
  }
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -c "import safetensors" 2>/dev/null &&
    return 0
  if "$py" -m pip install --quiet --no-deps --disable-pip-version-check --target "$build/python" \
    safetensors > /dev/null 2>&1; then
    ddp_log "safetensors for Python installed into $build/python (pip, for the PyTorch tests)"
  else
    ddp_log "safetensors for Python could not be installed ($py -m pip failed: no pip or no network); the README snippet's test skips"
  fi
}

# Configures build/ (or $DDP_BUILD_DIR) once; a later call finds it configured.
ddp_configure() {
  local root build
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  build="${DDP_BUILD_DIR:-$root/build}"
  # The CUDA toolkit is not always on PATH (e.g. /usr/local/cuda); CMake finds it via CUDACXX.
  if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    local generator=()
    if ! command -v make >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
      generator=(-G Ninja)
    fi
    # shellcheck disable=SC2086  # DDP_CMAKE_ARGS is a list of arguments
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${DDP_CMAKE_ARGS:-} || {
      rm -f "$build/CMakeCache.txt"  # configure again next time, after the fix
      return 1
    }
  fi
}

# Configures (once) and builds into build/ (or $DDP_BUILD_DIR), incrementally, then says in
# one line what this build was made without.
ddp_build() {
  local root build
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  build="${DDP_BUILD_DIR:-$root/build}"
  ddp_configure || return 1
  cmake --build "$build" -j "$(nproc)" || return 1
  if [ -s "$build/left-out.txt" ]; then
    ddp_log "built without: $(paste -sd ';' "$build/left-out.txt" | sed 's/;/; /g')"
  fi
  return 0
}
