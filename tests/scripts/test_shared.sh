#!/usr/bin/env bash
# -DBUILD_SHARED_LIBS=ON as a user meets it: this source tree configured and built with
# shared libraries (tools and libraries, no tests), installed into a prefix that is then
# moved (mv); the moved tools run without LD_LIBRARY_PATH and load ddp's libraries from the
# moved prefix; the examples built against the moved shared package run under its ddprun.
# Usage: test_shared.sh BUILD_DIR (the main build: its CMake cache gives the same options).
# Slow (a second build): label "package". Exit 77 without Gloo.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The main build's dependency hints (CMAKE_PREFIX_PATH, CUDA architectures), so that the
# shared build finds what it found.
args=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DDDP_BUILD_TESTS=OFF)
for var in CMAKE_PREFIX_PATH CMAKE_CUDA_ARCHITECTURES; do
  value="$(sed -n "s/^$var:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1)"
  [ -n "$value" ] && args+=("-D$var=$value")
done
cmake -S "$root" -B "$work/build" "${args[@]}" > "$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log"; echo "FAILED: configure with BUILD_SHARED_LIBS=ON"; exit 1; }
cmake --build "$work/build" -j "$(nproc)" > "$work/build.log" 2>&1 ||
  { grep -E "error|Error" "$work/build.log" | head -20; echo "FAILED: the shared build"; exit 1; }
cmake --install "$work/build" --prefix "$work/prefix" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "FAILED: cmake --install"; exit 1; }
mv "$work/prefix" "$work/moved" && ln -s /nonexistent "$work/prefix"
bin="$work/moved/bin"
ls "$work/moved/lib"/libddp_engine.so > /dev/null || { echo "FAILED: no libddp_engine.so installed"; exit 1; }
failed=0
# The tools load ddp's shared libraries from the moved prefix, nothing else.
libs="$(env -u LD_LIBRARY_PATH ldd "$bin/ddptrain" | grep libddp_)"
echo "$libs"
if grep -q "not found" <<<"$libs" || grep -qv "=> $work/moved/" <<<"$libs"; then
  echo "FAILED: ddptrain does not load ddp's libraries from the moved prefix"
  failed=1
fi
out="$(env -u LD_LIBRARY_PATH "$bin/ddptrain" --data synthetic --layers 16,32,4 --synthetic-samples 256 \
  --batch-size 32 --steps 5 --quiet 2>&1)"
grep -q "trained 5 steps" <<<"$out" || { echo "$out"; echo "FAILED: the moved ddptrain"; failed=1; }
cmake -S "$root/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$work/moved" \
  -DCMAKE_BUILD_TYPE=Release > "$work/examples.log" 2>&1 &&
  cmake --build "$work/examples" -j 2 >> "$work/examples.log" 2>&1 ||
  { tail -30 "$work/examples.log"; echo "FAILED: the examples against the shared package"; exit 1; }
if ! "$bin/ddptrain" --version | grep -q "gloo yes"; then
  echo "skipped running the examples: built without Gloo"
  [ $failed -eq 0 ] && exit 77
  exit $failed
fi
out="$(CUDA_VISIBLE_DEVICES= env -u LD_LIBRARY_PATH "$bin/ddprun" --nproc-per-node 2 -- "$work/examples/hello" 2>&1)"
grep -q "hello from rank 1 of 2 over gloo: sum 3" <<<"$out" ||
  { echo "$out"; echo "FAILED: hello against the shared package"; failed=1; }
env -u LD_LIBRARY_PATH ldd "$work/examples/hello" | grep libddp_ | head -3
[ $failed -eq 0 ] && echo "shared libraries: ok"
exit $failed
