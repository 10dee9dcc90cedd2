#!/usr/bin/env bash
# The installed package as a user meets it: cmake --install this build into a prefix, moved
# (mv) to another one, build examples/ as a separate CMake project with find_package(ddp)
# from the moved copy (and hello with pkg-config), check that find_package(ddp 99) is
# refused with the version message, and run the examples under ddprun: hello (sum of rank + 1 over 2 ranks), own_model (replicas hold identical
# weights; the loss falls) and classifier (ddp::init: 2 ranks equal 1 process). Usage: test_examples.sh BUILD_DIR. Exit 77 without Gloo.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "FAILED: cmake --install"; exit 1; }
# Relocatable: nothing in the package names the prefix it was installed into.
mv "$work/prefix" "$work/moved" && ln -s /nonexistent "$work/prefix"
cmake -S "$root/examples" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/moved" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; echo "FAILED: configure the examples"; exit 1; }
grep "ddp 0" "$work/configure.log"
mkdir -p "$work/v99"
printf 'cmake_minimum_required(VERSION 3.24)\nproject(v99 LANGUAGES CXX)\nfind_package(ddp 99 REQUIRED)\n' \
  > "$work/v99/CMakeLists.txt"
if cmake -S "$work/v99" -B "$work/v99/build" -DCMAKE_PREFIX_PATH="$work/moved" > "$work/v99.log" 2>&1; then
  echo "FAILED: find_package(ddp 99) was accepted"; exit 1
fi
grep -q 'with requested version "99"' "$work/v99.log" ||
  { cat "$work/v99.log"; echo "FAILED: find_package(ddp 99) without the version message"; exit 1; }
echo "find_package(ddp 99): refused with the version message"
cmake --build "$work/build" -j 2 > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; echo "FAILED: build the examples"; exit 1; }
# Without CMake: the hello example compiled with pkg-config's flags from the moved copy
# (scripts/deps.sh installs pkgconf for the tests).
pkg=0
if command -v pkg-config > /dev/null; then
  pkg=1
  pc="$(PKG_CONFIG_PATH="$work/moved/lib/pkgconfig" pkg-config --cflags --libs ddp 2>&1)" ||
    { echo "$pc"; echo "FAILED: pkg-config ddp"; exit 1; }
  g++ -std=c++17 -O1 "$root/examples/hello/hello.cpp" -o "$work/hello-pc" $pc > "$work/pc.log" 2>&1 ||
    { tail -20 "$work/pc.log"; echo "FAILED: hello built with pkg-config --cflags --libs ddp"; exit 1; }
else
  echo "no pkg-config on PATH: the pkg-config build is left out"
fi
if ! "$work/moved/bin/ddptrain" --version | grep -q "gloo yes"; then
  echo "skipped running: built without Gloo (the examples built)"
  exit 77
fi
failed=0
out="$(CUDA_VISIBLE_DEVICES= "$work/moved/bin/ddprun" --nproc-per-node 2 -- "$work/build/hello" 2>&1)"
echo "$out"
grep -q "hello from rank 0 of 2 over gloo: sum 3" <<<"$out" || { echo "FAILED: hello rank 0"; failed=1; }
grep -q "hello from rank 1 of 2 over gloo: sum 3" <<<"$out" || { echo "FAILED: hello rank 1"; failed=1; }
if [ $pkg -eq 1 ]; then
  out="$(CUDA_VISIBLE_DEVICES= "$work/moved/bin/ddprun" --nproc-per-node 2 -- "$work/hello-pc" 2>&1)"
  grep -q "hello from rank 1 of 2 over gloo: sum 3" <<<"$out" ||
    { echo "$out"; echo "FAILED: hello built with pkg-config"; failed=1; }
fi
out="$(CUDA_VISIBLE_DEVICES= "$work/moved/bin/ddprun" --nproc-per-node 2 -- "$work/build/own_model" 2>&1)"
echo "$out"
sums="$(grep -oE 'checksum [0-9a-f]+' <<<"$out" | sort -u | wc -l)"
[ "$sums" -eq 1 ] || { echo "FAILED: the replicas differ"; failed=1; }
loss="$(grep -oE 'rank 0 of 2: final loss [0-9.]+' <<<"$out" | awk '{print $NF}')"
awk -v l="${loss:-9}" 'BEGIN { exit !(l < 0.05) }' || { echo "FAILED: loss ${loss:-none} not below 0.05"; failed=1; }
one="$("$work/build/classifier" 2>&1)"
two="$(CUDA_VISIBLE_DEVICES= "$work/moved/bin/ddprun" --nproc-per-node 2 -- "$work/build/classifier" 2>&1)"
echo "$one"; echo "$two"
w1="$(grep -oE 'rank 0 of 1: weights .*' <<<"$one" | cut -d' ' -f6-)"
w2="$(grep -oE 'rank 0 of 2: weights .*' <<<"$two" | cut -d' ' -f6-)"
python3 - "$w1" "$w2" <<'PY' || { echo "FAILED: classifier on 2 ranks against 1"; failed=1; }
import sys
a, b = ([float(v) for v in s.split()] for s in sys.argv[1:3])
assert len(a) == 3 and len(b) == 3 and all(abs(x - y) <= 1e-5 * (1 + abs(x)) for x, y in zip(a, b)), (a, b)
PY
[ $failed -eq 0 ] && echo "examples: ok"
exit $failed
