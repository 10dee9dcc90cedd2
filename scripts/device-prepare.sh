#!/usr/bin/env bash
# Run here (not on the device) before a device call: copies into the git-ignored .deps/
# what the device image lacks: the Fashion-MNIST files, and the headers of zlib and
# nlohmann-json, each in a prefix of its own (.deps/zlib, .deps/json) so that a library the
# image does have is never shadowed by our copy. scripts/device-check.sh puts both on
# CMAKE_PREFIX_PATH, nothing else. Name .deps in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps/include .deps/share
mkdir -p .deps/fashion-mnist .deps/zlib/include .deps/json/include
cp -u /usr/share/datasets/fashion-mnist/*.gz .deps/fashion-mnist/
cp -u /usr/include/zlib.h /usr/include/zconf.h .deps/zlib/include/
cp -ru /usr/include/nlohmann .deps/json/include/
du -sh .deps
