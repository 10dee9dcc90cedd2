#!/usr/bin/env bash
# Run here (not on the device) before a device call: copies into the git-ignored .deps/
# what the device image lacks: the Fashion-MNIST files and header-only dependencies.
# Name .deps in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/include .deps/fashion-mnist
cp -u /usr/share/datasets/fashion-mnist/*.gz .deps/fashion-mnist/
cp -ru /usr/include/nlohmann .deps/include/
cp -u /usr/include/zlib.h /usr/include/zconf.h .deps/include/
mkdir -p .deps/share/cmake
cp -ru /usr/share/cmake/nlohmann_json .deps/share/cmake/
du -sh .deps
