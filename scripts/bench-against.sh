#!/usr/bin/env bash
# An engine change against the commit before it, in one device run: builds OLD_SRC (a
# source tree of the old commit, e.g. `git archive OLD | tar -x -C .deps/old` here, carried
# to the device) beside this tree's BUILD, checks with scripts/compare-builds.sh that fp32
# weights after 40 GPU steps are bitwise the old ones (alone and with 2 ranks sharing the GPU,
# several configurations), then runs scripts/bench-vs-torch.sh on both builds, workload by
# workload in turn. Exits non-zero when the weights differ.
# Usage: scripts/bench-against.sh OLD_SRC BUILD [workload:precision ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
old_src="$1"
build="$2"
shift 2
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=("${ddp_default_runs[@]}")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
old_build="$old_src/build-gpu"
cmake -S "$old_src" -B "$old_build" -DCMAKE_BUILD_TYPE=Release ${DDP_CMAKE_ARGS:-} > "$old_build.log" 2>&1 &&
  cmake --build "$old_build" -j "$(nproc)" --target ddptrain ddprun >> "$old_build.log" 2>&1 ||
  { tail -20 "$old_build.log"; echo "bench-against: the old tree did not build"; exit 2; }
tmp="$(mktemp -d)"
# The weights: bitwise the old build's in every configuration of compare-builds.sh.
scripts/compare-builds.sh "$old_build" "$build" "$tmp"
status=$?
# Speed: old and new in turn for each workload, so that drift over the run hits both alike.
for run in "${runs[@]}"; do
  for side in old new; do
    b="$build"; [ "$side" = old ] && b="$old_build"
    echo "bench-vs-torch, $side build ($b), $run:"
    TORCH_MODES="" scripts/bench-vs-torch.sh "$b" "$run" | grep -E '^\| (tiny|medium|large)|failed'
  done
done
rm -rf "$tmp"
exit $status
