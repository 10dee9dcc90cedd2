#!/usr/bin/env bash
# Run here (not on the device) before a device call: copies into the git-ignored .deps/
# what the device image lacks: the Fashion-MNIST files, and the headers of zlib and
# nlohmann-json, each in a prefix of its own (.deps/zlib, .deps/json) so that a library the
# image does have is never shadowed by our copy. scripts/device-check.sh puts both on
# CMAKE_PREFIX_PATH, nothing else. Name .deps in the device call's carry list.
# --nccl-tests GIT_DIR: also the source of nccl-tests (a clone or bare repository of
# github.com/NVIDIA/nccl-tests), for scripts/bench-collectives.sh to build on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps/include .deps/share
mkdir -p .deps/fashion-mnist .deps/zlib/include .deps/json/include
cp -u /usr/share/datasets/fashion-mnist/*.gz .deps/fashion-mnist/
cp -u /usr/include/zlib.h /usr/include/zconf.h .deps/zlib/include/
cp -ru /usr/include/nlohmann .deps/json/include/
if [ "${1:-}" = "--nccl-tests" ]; then
  [ -n "${2:-}" ] || { echo "device-prepare.sh: --nccl-tests needs a git directory" >&2; exit 2; }
  rm -rf .deps/nccl-tests && mkdir -p .deps/nccl-tests
  git -C "$2" archive HEAD | tar -x -C .deps/nccl-tests
  echo "nccl-tests $(git -C "$2" log -1 --format='%h %s') in .deps/nccl-tests"
fi
du -sh .deps
