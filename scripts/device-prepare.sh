#!/usr/bin/env bash
# Run here (not on the device) before a device call: copies into the git-ignored .deps/
# what the device image lacks: the Fashion-MNIST files and the headers of nlohmann-json and
# zlib (scripts/device-check.sh puts .deps on CMAKE_PREFIX_PATH, nothing else).
# Name .deps in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/include .deps/fashion-mnist
cp -u /usr/share/datasets/fashion-mnist/*.gz .deps/fashion-mnist/
cp -ru /usr/include/nlohmann .deps/include/
cp -u /usr/include/zlib.h /usr/include/zconf.h .deps/include/
rm -rf .deps/share  # headers only: CMake finds nlohmann-json by its header
du -sh .deps
