#!/usr/bin/env bash
# An engine change against the commit before it, in one device run: builds OLD_SRC (a
# source tree of the old commit, e.g. `git archive OLD | tar -x -C .deps/old` here, carried
# to the device) beside this tree's BUILD, checks that fp32 weights after 40 GPU steps are
# bitwise the old ones, alone and with 2 ranks sharing the GPU, then runs
# scripts/bench-vs-torch.sh on both builds. Exits non-zero when the weights differ.
# Usage: scripts/bench-against.sh OLD_SRC BUILD [workload:precision ...]
set -uo pipefail
cd "$(dirname "$0")/.."
old_src="$1"
build="$2"
shift 2
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(tiny:tf32 tiny:bf16 medium:tf32 large:tf32)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
old_build="$old_src/build-gpu"
cmake -S "$old_src" -B "$old_build" -DCMAKE_BUILD_TYPE=Release ${DDP_CMAKE_ARGS:-} > "$old_build.log" 2>&1 &&
  cmake --build "$old_build" -j "$(nproc)" --target ddptrain ddprun >> "$old_build.log" 2>&1 ||
  { tail -20 "$old_build.log"; echo "bench-against: the old tree did not build"; exit 2; }
tmp="$(mktemp -d)"
args=(--device cuda --data synthetic --layers 784,512,512,10 --synthetic-samples 8192
      --batch-size 256 --steps 40 --log-every 10 --quiet --seed 7)
status=0
for side in old new; do
  b="$build"; [ "$side" = old ] && b="$old_build"
  "$b/bin/ddptrain" "${args[@]}" --save-weights "$tmp/$side-1.st" > "$tmp/$side-1.log" 2>&1 ||
    { tail -5 "$tmp/$side-1.log"; status=1; }
  "$b/bin/ddprun" --share-gpu --nproc-per-node 2 -- "$b/bin/ddptrain" "${args[@]}" \
    --save-weights "$tmp/$side-2.st" > "$tmp/$side-2.log" 2>&1 || { tail -5 "$tmp/$side-2.log"; status=1; }
done
for ranks in 1 2; do
  if cmp -s "$tmp/old-$ranks.st" "$tmp/new-$ranks.st"; then
    echo "bitwise: fp32 weights after 40 steps, $ranks rank(s): identical to the old commit"
  else
    echo "bitwise: fp32 weights after 40 steps, $ranks rank(s): DIFFER from the old commit"
    status=1
  fi
done
for side in old new; do
  b="$build"; [ "$side" = old ] && b="$old_build"
  echo "bench-vs-torch, $side build:"
  scripts/bench-vs-torch.sh "$b" "${runs[@]}"
done
rm -rf "$tmp"
exit $status
