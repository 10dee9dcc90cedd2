#!/usr/bin/env bash
# ddp::GradScaler against PyTorch's torch.amp.GradScaler (issue 73): the same overflow pattern
# driven through both on the GPU (ddp's in tests/libtorch/unit_worker, one process and R ranks
# sharing the GPU with the inf on the last rank alone; PyTorch's in
# tests/libtorch/grad_scaler_reference.py), the scale after each update and whether the step was
# taken compared line by line. Needs a CUDA LibTorch build and Python's torch with CUDA.
# Usage: [RANKS=2] [PYTHON=python3] scripts/check-grad-scaler.sh BUILD_DIR
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/check-grad-scaler.sh BUILD_DIR}"
worker="$build/bin/ddp_torch_unit_worker"
[ -x "$worker" ] || { echo "check-grad-scaler: no $worker (build ddp_torch_unit_worker)" >&2; exit 2; }
ranks="${RANKS:-2}"
steps=12 overflow=1,4,5,9
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" tests/libtorch/grad_scaler_reference.py --steps $steps --overflow $overflow \
  > "$work/pytorch"
flags=(--cuda --scaler --steps $steps --overflow $overflow)
"$worker" --single "${flags[@]}" --out "$work/one.out" | grep -o 'rank 0 step .* stepped .*' > "$work/one"
"$build/bin/ddprun" --share-gpu --nproc-per-node "$ranks" -- "$worker" "${flags[@]}" --zero 3 --units \
  --overflow-rank $((ranks - 1)) --out "$work/ranks.out" | grep -o 'rank 0 step .* stepped .*' > "$work/ranks" || true
status=0
for run in one ranks; do
  if diff "$work/pytorch" "$work/$run" > "$work/$run.diff"; then
    echo "check-grad-scaler: $run ($([ $run = one ] && echo 'one process' || echo "$ranks ranks, zero(3) units, inf on rank $((ranks - 1))")): $(wc -l < "$work/$run") updates as PyTorch's"
  else
    echo "check-grad-scaler: $run differs from PyTorch's GradScaler:"; cat "$work/$run.diff"; status=1
  fi
done
echo "PyTorch's sequence:"; cat "$work/pytorch"
exit $status
