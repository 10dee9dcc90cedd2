#!/usr/bin/env bash
# LibTorch across ranks against PyTorch's Python DDP, in one run (issues 56, 58 and 60): for each
# model of ddp_torch_bench (the example's CNN, the 50 M-parameter MLP, ResNet-18, transformer
# blocks), with AdamW and each rank's own batch, ddp::DistributedDataParallel under ddprun
# against PyTorch's DistributedDataParallel under torchrun:
#   plain: both plain;
#   zero:  ZeRO 1, 2 and 3 (DistributedDataParallelOptions().zero(N)) against PyTorch's
#          ZeroRedundancyOptimizer (its ZeRO 1) on the zero(1) row;
#   hooks: the bf16 compression hook and PowerSGD (rank 1, from the 11th step) on each side,
#          with the elements PowerSGD sent of those it took (ddp's count).
# Prints rank 0's ms per step (the median of 5 rounds) and what it holds (optimizer state,
# parameters, gradients). On the GPU (the default) one rank a GPU: ddprun gives each its
# CUDA_VISIBLE_DEVICES, torchrun's processes take their LOCAL_RANK's; --cpu: ranks on the CPU
# (Gloo; PyTorch's bf16 hook needs NCCL, so that cell is empty there).
# Usage: scripts/bench-libtorch-ranks.sh BUILD_DIR [--cpu] [--ranks N] [--models LIST]
#     [--runs LIST] [--steps N] [--batch N]
#   --ranks: default the GPUs nvidia-smi lists (the CPU: 2); --models: comma-separated (mlp);
#   --runs: plain,zero,hooks (all); --steps: a round's (GPU 50, CPU 3); --batch: each rank's
#   (the model's own on the GPU, 64 on the CPU). DDP_PYTHON: the Python with torch (else
#   /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/bench-libtorch-ranks.sh BUILD_DIR [--cpu] [--ranks N] [--models LIST] [--runs LIST] [--steps N] [--batch N]"
build="${1:?$usage}"
shift
cpu=0 ranks="" models=mlp runs=plain,zero,hooks steps="" batch=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cpu=1 ;;
    --ranks) ranks="${2:?--ranks needs a number}"; shift ;;
    --models) models="${2:?--models needs a list}"; shift ;;
    --runs) runs="${2:?--runs needs a list}"; shift ;;
    --steps) steps="${2:?--steps needs a number}"; shift ;;
    --batch) batch="${2:?--batch needs a number}"; shift ;;
    *) echo "bench-libtorch-ranks.sh: unknown argument $1 (expected --cpu, --ranks N, --models LIST, --runs LIST, --steps N or --batch N)" >&2; exit 2 ;;
  esac
  shift
done
for run in ${runs//,/ }; do
  case "$run" in plain | zero | hooks) ;; *) echo "bench-libtorch-ranks.sh: --runs $runs: expected plain, zero or hooks" >&2; exit 2 ;; esac
done
bench="$build/bin/ddp_torch_bench"
[ -x "$bench" ] || { echo "bench-libtorch-ranks.sh: $bench not built (configure with LibTorch)" >&2; exit 2; }
[ -x "$build/bin/ddprun" ] || { echo "bench-libtorch-ranks.sh: $build/bin/ddprun not built" >&2; exit 2; }
py="${DDP_PYTHON:-/usr/bin/python3}"
"$py" -c 'import torch.distributed.run' 2>/dev/null || { echo "bench-libtorch-ranks.sh: $py has no torch (set DDP_PYTHON)" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
device=()
if [ $cpu = 1 ]; then
  export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1
  ranks="${ranks:-2}" steps="${steps:-3}" batch="${batch:-64}"
else
  device=(--cuda)
  ranks="${ranks:-$(nvidia-smi -L 2>/dev/null | wc -l)}" steps="${steps:-50}"
  [ "$ranks" -ge 1 ] || { echo "bench-libtorch-ranks.sh: no GPU listed by nvidia-smi (use --cpu)" >&2; exit 2; }
fi
[ "$ranks" -ge 2 ] || echo "bench-libtorch-ranks.sh: $ranks rank: nothing is reduced (--ranks N, or more GPUs)" >&2

# "ms|holds|sent" of rank 0 from one run's output, or empty where it printed no step time.
pick() {
  local out="$1" prefix="$2" ms held sent
  ms="$(grep -oE "$prefix(libtorch|pytorch) .*ms_per_step [0-9.]+" <<<"$out" | head -1 | grep -oE '[0-9.]+$' || true)"
  held="$(grep -oE "${prefix}rank 0 (holds: |optimizer state ).*" <<<"$out" | head -1 | sed -E 's/.*rank 0 (holds: )?//' || true)"
  sent="$(grep -oE "${prefix}rank 0 powersgd sent .*" <<<"$out" | head -1 | sed 's/.*powersgd //' || true)"
  [ -n "$ms" ] && echo "$ms|$held|$sent"
}
# One run of ddp_torch_bench on every rank (ddprun), then of torch_bench.py (torchrun, bounded:
# PyTorch 1.13's Gloo has been seen to hang at exit after printing), each cell "ms|holds|sent".
ddp_cell() {
  local out
  out="$("$build/bin/ddprun" --nproc-per-node "$ranks" -- "$bench" "${common[@]}" "$@" 2>&1)" ||
    { echo "$out" | tail -5 >&2; echo "bench-libtorch-ranks.sh: ddp_torch_bench $* failed" >&2; exit 1; }
  pick "$out" '\[rank 0\] ' || { echo "$out" | tail -5 >&2; exit 1; }
}
py_cell() {
  local out
  out="$(timeout 600 "$py" -m torch.distributed.run --nproc_per_node "$ranks" -r 1 -t 1 \
    --master_port "$(( 20000 + RANDOM % 20000 ))" tests/libtorch/torch_bench.py "${common[@]}" "$@" 2>&1 || true)"
  pick "$out" '\[default0\]:' || { echo "$out" | grep -E 'Error|error' | tail -1 | sed 's/^/  (PyTorch: /;s/$/)/' >&2; echo "||"; }
}
row() {  # model, run name, ddp cell, PyTorch cell
  local d p ratio=""
  IFS='|' read -r -a d <<<"$3"
  IFS='|' read -r -a p <<<"$4"
  [ -n "${d[0]:-}" ] || d=("failed (above)")
  [ -n "${p[0]:-}" ] && [ -n "${3%%|*}" ] && ratio="$(awk -v a="${d[0]}" -v b="${p[0]}" 'BEGIN { printf "%.2fx", b / a }')"
  echo "| $1 | $2 | ${d[0]} | ${p[0]:--} | $ratio | ${d[1]:-} | ${p[1]:-} | ${d[2]:-} |"
}

echo "| model | run | ddp::DistributedDataParallel ms/step | PyTorch DDP ms/step | PyTorch / ddp | ddp rank 0 holds | PyTorch rank 0 optimizer state | PowerSGD sent (ddp) |"
echo "|---|---|---|---|---|---|---|---|"
for model in ${models//,/ }; do
  common=(--model "$model" --mode ddp --adamw --steps "$steps" --warmup 12 "${device[@]}")
  [ -n "$batch" ] && common+=(--batch "$batch")
  for run in ${runs//,/ }; do
    case "$run" in
      plain) row "$model" "plain" "$(ddp_cell)" "$(py_cell)" ;;
      zero)
        row "$model" "ZeRO 1 (PyTorch: ZeroRedundancyOptimizer)" "$(ddp_cell --zero 1)" "$(py_cell --zero)"
        for level in 2 3; do row "$model" "ZeRO $level" "$(ddp_cell --zero $level)" "||"; done ;;
      hooks)
        bf16_py="||"
        [ $cpu = 0 ] && bf16_py="$(py_cell --hook bf16)"
        row "$model" "bf16 compression hook" "$(ddp_cell --hook bf16)" "$bf16_py"
        row "$model" "PowerSGD rank 1" "$(ddp_cell --hook powersgd)" "$(py_cell --hook powersgd)" ;;
    esac
  done
done
echo "($ranks ranks, $( [ $cpu = 1 ] && echo CPU || nvidia-smi --query-gpu=name --format=csv,noheader | head -1), AdamW, $steps steps a round, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
