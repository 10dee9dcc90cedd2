#!/usr/bin/env bash
# ddp::Checkpointer's cost to training (issue 74): tests/libtorch/unit_worker's model (BLOCKS
# residual blocks of DIM features, AdamW) saved once after its first step, by save() and by
# async_save(), REPEAT times each into DIR (default a temporary folder): the seconds training
# was blocked and the seconds written (the worker's Checkpointer line), the checkpoint's size,
# and the disk's own write rate (dd of as many bytes with fsync) beside it. On the GPU (CUDA=1)
# the model lives there and the copy goes to pinned host memory. The last row: async_save()'s
# second save in one run with CheckpointerOptions::keep_staging (the host copies reused).
# Usage: [BLOCKS=24] [DIM=1024] [REPEAT=2] [CUDA=0] [DIR=...] scripts/bench-checkpoint.sh BUILD_DIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-checkpoint.sh BUILD_DIR}"
worker="$build/bin/ddp_torch_unit_worker"
[ -x "$worker" ] || { echo "bench-checkpoint: no $worker (build ddp_torch_unit_worker)" >&2; exit 2; }
dir="${DIR:-$(mktemp -d)}"
flags=(--single --adamw --blocks "${BLOCKS:-24}" --dim "${DIM:-1024}" --batch 8 --steps 2 --save-at 0)
[ "${CUDA:-0}" = 1 ] && flags+=(--cuda) || export CUDA_VISIBLE_DEVICES=
echo "| save | blocked s | written s | size |"
echo "|---|---|---|---|"
size=0
for ((i = 0; i < ${REPEAT:-2}; ++i)); do
  for mode in save async_save; do
    rm -rf "$dir/ckpt"
    extra=(); [ "$mode" = async_save ] && extra=(--async-save)
    line="$("$worker" "${flags[@]}" --checkpoint-dir "$dir/ckpt" "${extra[@]}" 2>&1 |
      grep -oE '\(([0-9.]+) s blocked, ([0-9.]+) s written\)')" ||
      { echo "bench-checkpoint: the $mode run failed" >&2; exit 1; }
    size=$(du -sb "$dir/ckpt" | awk '{print $1}')
    echo "| $mode | $(sed -E 's/\(([0-9.]+) s blocked, ([0-9.]+) s written\)/\1 | \2/' <<<"$line") | $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }') |"
  done
done
rm -rf "$dir/ckpt"
lines="$("$worker" "${flags[@]}" --save-at 0,1 --steps 3 --async-save --keep-staging \
  --checkpoint-dir "$dir/ckpt" 2>&1 | grep -oE '\(([0-9.]+) s blocked, ([0-9.]+) s written\)' | tail -1)" ||
  { echo "bench-checkpoint: the keep_staging run failed" >&2; exit 1; }
echo "| async_save, staging kept (2nd save) | $(sed -E 's/\(([0-9.]+) s blocked, ([0-9.]+) s written\)/\1 | \2/' <<<"$lines") | $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }') |"
rm -rf "$dir/ckpt"
count=$(( (size + 67108863) / 67108864 ))
rate="$(dd if=/dev/zero of="$dir/dd.bin" bs=64M count="$count" conv=fsync 2>&1 | tail -1)"
rm -f "$dir/dd.bin"
echo "dd of the same bytes with fsync: $rate"
