#!/usr/bin/env bash
# The LibTorch wrapper's cost (issue 44), in one run: a training step of the example's network
# (cnn, batch 64) and of a 50 M-parameter MLP (mlp, batch 512), plain LibTorch against
# ddp::DistributedDataParallel on one rank (ddp_torch_bench), and the same in Python, plain
# PyTorch against PyTorch's DistributedDataParallel on one rank (tests/libtorch/torch_bench.py).
# Each pair runs --reps times (3), interleaved; the table gives the medians (ms per step) and
# the plain and wrapped runs' ranges (a launch-bound step moves by several per cent from run to
# run on a shared machine).
# Usage: scripts/bench-libtorch.sh BUILD_DIR [--cpu] [--steps N] [--reps N]
#   the GPU by default; DDP_PYTHON: the Python with torch (else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-libtorch.sh BUILD_DIR [--cpu] [--steps N] [--reps N]}"
shift
cuda=--cuda
steps=100
reps=3
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cuda="" ;;
    --steps) steps="${2:?--steps needs a number}"; shift ;;
    --reps) reps="${2:?--reps needs a number}"; shift ;;
    *) echo "bench-libtorch.sh: unknown argument $1 (expected --cpu, --steps N or --reps N)" >&2; exit 2 ;;
  esac
  shift
done
bench="$build/bin/ddp_torch_bench"
[ -x "$bench" ] || { echo "bench-libtorch.sh: $bench not built (configure with LibTorch: the torch component)" >&2; exit 2; }
py="${DDP_PYTHON:-python3}"
"$py" -c 'import torch' 2>/dev/null || { echo "bench-libtorch.sh: $py has no torch (set DDP_PYTHON)" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
for model in cnn mlp; do
  for rep in $(seq "$reps"); do
    for mode in plain ddp; do
      "$bench" --model $model --mode $mode $cuda --steps "$steps" | tee -a "$results"
      MASTER_PORT=$((29500 + RANDOM % 1000)) "$py" tests/libtorch/torch_bench.py --model $model \
        --mode $mode $cuda --steps "$steps" | tee -a "$results"
    done
  done
done
"$py" - "$results" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) (\w+) (\w+): ms_per_step ([0-9.]+)", line)
    if m:
        runs.setdefault(m.group(1, 2, 3), []).append(float(m.group(4)))
med = {k: statistics.median(v) for k, v in runs.items()}
print("| model | LibTorch | ddp::DistributedDataParallel | overhead | PyTorch | PyTorch DDP | ddp C++ vs PyTorch DDP | LibTorch range | wrapped range |")
print("|---|---|---|---|---|---|---|---|---|")
for model in ("cnn", "mlp"):
    lt, dd = med[("libtorch", model, "plain")], med[("libtorch", model, "ddp")]
    pt, pd = med[("pytorch", model, "plain")], med[("pytorch", model, "ddp")]
    span = lambda k: f"{min(runs[k]):.4f}-{max(runs[k]):.4f}"
    print(f"| {model} | {lt:.4f} | {dd:.4f} | {100 * (dd / lt - 1):+.1f} % | {pt:.4f} | {pd:.4f} | "
          f"{pd / dd:.2f}x faster | {span(('libtorch', model, 'plain'))} | {span(('libtorch', model, 'ddp'))} |")
PY
