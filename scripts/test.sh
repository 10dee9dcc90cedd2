#!/usr/bin/env bash
# The README's test command: installs what is missing, builds into build/, runs every test
# that can run on this machine (GPU tests skip themselves without a GPU). Extra arguments
# go to ctest (e.g. -L unit, -R Sampler).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ddp_install_deps --tests
ddp_build
ddp_python_test_deps "$(cd "${DDP_BUILD_DIR:-build}" && pwd)"
cd "${DDP_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
