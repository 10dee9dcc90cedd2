#!/usr/bin/env bash
# Where a data-parallel step's time goes on the GPUs: ddptrain --timeline (CUDA events inside
# the step) for workloads on one GPU and on every GPU, each summarised by timeline_stats.py
# (forward, backward, the wait after backward, the all-reduces and the part of them that ran
# after backward). Traces and tables go to $OUT (or ./profile-out).
# Usage: scripts/profile-ddp.sh BUILD_DIR [workload:precision ...]   (default medium:tf32 large:tf32)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
build="${1:-build}"
shift || true
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(medium:tf32 large:tf32)
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
gpus="$(nvidia-smi -L | wc -l)"
status=0
for run in "${runs[@]}"; do
  ddp_workload "${run%%:*}" || exit 2
  prec="${run##*:}"
  steps=30
  args=(--device cuda --precision "$prec" --data synthetic --layers "$layers" --steps "$steps"
        --log-every 10 --lr-schedule constant --lr 0.01 --quiet)
  name="${run/:/-}"
  timeout 300 "$build/bin/ddptrain" "${args[@]}" --batch-size "$batch" --synthetic-samples $((batch * 2)) \
    --timeline "$out/$name-1gpu.json" > "$out/$name-1gpu.log" 2>&1 || { tail -3 "$out/$name-1gpu.log"; status=1; continue; }
  timeout 300 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" "${args[@]}" \
    --batch-size $((batch * gpus)) --synthetic-samples $((batch * gpus * 2)) \
    --timeline "$out/$name-${gpus}gpu.json" > "$out/$name-${gpus}gpu.log" 2>&1 || { tail -3 "$out/$name-${gpus}gpu.log"; status=1; continue; }
  for n in 1 "$gpus"; do
    echo
    echo "$run, $n GPU(s), median of steps 3-$steps (ms):"
    "${PYTHON:-python3}" scripts/timeline_stats.py "$out/$name-${n}gpu.json" | tee "$out/$name-${n}gpu.md"
  done
done
exit $status
