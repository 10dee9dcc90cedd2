#!/usr/bin/env bash
# ZeRO for LibTorch modules against PyTorch's own, in one run, on 2 CPU ranks (issue 56): the
# 50 M-parameter MLP of bench-libtorch.sh with AdamW, a step of each rank's --batch, under
# ddp::DistributedDataParallel (ddprun) with zero(0) to zero(3), and under PyTorch's Python DDP
# (torchrun) plain and with ZeroRedundancyOptimizer (PyTorch's ZeRO 1). Prints each run's
# ms per step (median of 5 rounds) and what rank 0 holds (optimizer state, parameters,
# gradients). CPU only: two GPUs are the multi-GPU issue's.
# Usage: scripts/bench-libtorch-zero.sh BUILD_DIR [--steps N] [--batch N]
#   DDP_PYTHON: the Python with torch (else /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-libtorch-zero.sh BUILD_DIR [--steps N] [--batch N]}"
shift
steps=3
batch=64
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="${2:?--steps needs a number}"; shift ;;
    --batch) batch="${2:?--batch needs a number}"; shift ;;
    *) echo "bench-libtorch-zero.sh: unknown argument $1 (expected --steps N or --batch N)" >&2; exit 2 ;;
  esac
  shift
done
bench="$build/bin/ddp_torch_bench"
[ -x "$bench" ] || { echo "bench-libtorch-zero.sh: $bench not built (configure with LibTorch)" >&2; exit 2; }
[ -x "$build/bin/ddprun" ] || { echo "bench-libtorch-zero.sh: $build/bin/ddprun not built" >&2; exit 2; }
py="${DDP_PYTHON:-/usr/bin/python3}"
"$py" -c 'import torch.distributed.run' 2>/dev/null || { echo "bench-libtorch-zero.sh: $py has no torch (set DDP_PYTHON)" >&2; exit 2; }
export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1
common=(--model mlp --mode ddp --adamw --batch "$batch" --steps "$steps" --warmup 1)
echo "| run | ms per step (rank 0) | rank 0 holds |"
echo "|---|---|---|"
for zero in 0 1 2 3; do
  out="$("$build/bin/ddprun" --nproc-per-node 2 -- "$bench" "${common[@]}" --zero "$zero" 2>&1)"
  ms="$(grep -oE '\[rank 0\] libtorch .*ms_per_step [0-9.]+' <<<"$out" | grep -oE '[0-9.]+$')"
  held="$(grep -oE '\[rank 0\] rank 0 holds: .*' <<<"$out" | sed 's/.*holds: //')"
  [ -n "$ms" ] || { echo "$out"; echo "bench-libtorch-zero.sh: ddp zero $zero failed" >&2; exit 1; }
  echo "| ddp::DistributedDataParallel zero($zero) | $ms | $held |"
done
for zero in "" --zero; do
  out="$("$py" -m torch.distributed.run --nproc_per_node 2 -r 1 -t 1 \
    --master_port "$(( 20000 + RANDOM % 20000 ))" tests/libtorch/torch_bench.py "${common[@]}" $zero 2>&1)"
  ms="$(grep -oE '\[default0\]:pytorch .*ms_per_step [0-9.]+' <<<"$out" | grep -oE '[0-9.]+$')"
  held="$(grep -oE '\[default0\]:rank 0 optimizer state .*' <<<"$out" | sed 's/.*optimizer state /optimizer state /' || true)"
  [ -n "$ms" ] || { echo "$out"; echo "bench-libtorch-zero.sh: PyTorch ${zero:-plain} failed" >&2; exit 1; }
  echo "| PyTorch DDP${zero:+ + ZeroRedundancyOptimizer} | $ms | ${held:-(all of it)} |"
done
