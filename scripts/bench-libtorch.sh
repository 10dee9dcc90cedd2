#!/usr/bin/env bash
# The LibTorch wrapper's cost (issue 44), in one run: a training step of the example's network
# (cnn, batch 64), of a 50 M-parameter MLP (mlp, batch 512), of ResNet-18 as for CIFAR-10
# (resnet, batch 128) and of 4 transformer blocks of width 1024 (transformer, batch 16 of 256
# tokens), each in float32 and in bfloat16 (the model in bf16), plain LibTorch against
# ddp::DistributedDataParallel on one rank (ddp_torch_bench), and the same in Python, plain
# PyTorch against PyTorch's DistributedDataParallel on one rank (tests/libtorch/torch_bench.py).
# Each pair runs --reps times (3), interleaved; the table gives the medians (ms per step) and
# the plain and wrapped runs' ranges (a launch-bound step moves by several per cent from run to
# run on a shared machine).
# Usage: scripts/bench-libtorch.sh BUILD_DIR [--cpu] [--steps N] [--reps N] [--models LIST]
#     [--dtypes LIST]
#   the GPU by default; LIST: comma-separated (cnn,mlp,resnet,transformer; fp32,bf16: all by
#   default); DDP_PYTHON: the Python with torch (else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-libtorch.sh BUILD_DIR [--cpu] [--steps N] [--reps N] [--models LIST] [--dtypes LIST]}"
shift
cuda=--cuda
steps=100
reps=3
models=cnn,mlp,resnet,transformer
dtypes=fp32,bf16
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cuda="" ;;
    --steps) steps="${2:?--steps needs a number}"; shift ;;
    --reps) reps="${2:?--reps needs a number}"; shift ;;
    --models) models="${2:?--models needs a list}"; shift ;;
    --dtypes) dtypes="${2:?--dtypes needs a list}"; shift ;;
    *) echo "bench-libtorch.sh: unknown argument $1 (expected --cpu, --steps N, --reps N, --models LIST or --dtypes LIST)" >&2; exit 2 ;;
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
for model in ${models//,/ }; do
  for dtype in ${dtypes//,/ }; do
    for rep in $(seq "$reps"); do
      for mode in plain ddp; do
        "$bench" --model $model --mode $mode $cuda --steps "$steps" --dtype $dtype | tee -a "$results"
        # PyTorch's Gloo has no bf16 broadcast (1.13): no Python DDP reference on the CPU in bf16.
        [ -z "$cuda" ] && [ $dtype = bf16 ] && [ $mode = ddp ] && continue
        MASTER_PORT=$((29500 + RANDOM % 1000)) "$py" tests/libtorch/torch_bench.py --model $model \
          --mode $mode $cuda --steps "$steps" --dtype $dtype | tee -a "$results"
      done
    done
  done
done
"$py" - "$results" "$models" "$dtypes" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) (\w+) (\w+)( bf16)?: ms_per_step ([0-9.]+)", line)
    if m:
        key = (m.group(1), m.group(2), m.group(3), "bf16" if m.group(4) else "fp32")
        runs.setdefault(key, []).append(float(m.group(5)))
med = {k: statistics.median(v) for k, v in runs.items()}
nan = float("nan")
print("| model | dtype | LibTorch | ddp::DistributedDataParallel | overhead | PyTorch | PyTorch DDP | ddp C++ vs PyTorch DDP | LibTorch range | wrapped range |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in sys.argv[2].split(","):
    for dtype in sys.argv[3].split(","):
        lt, dd = med[("libtorch", model, "plain", dtype)], med[("libtorch", model, "ddp", dtype)]
        pt, pd = med.get(("pytorch", model, "plain", dtype), nan), med.get(("pytorch", model, "ddp", dtype), nan)
        span = lambda k: f"{min(runs[k]):.4f}-{max(runs[k]):.4f}"
        print(f"| {model} | {dtype} | {lt:.4f} | {dd:.4f} | {100 * (dd / lt - 1):+.1f} % | {pt:.4f} | "
              f"{pd:.4f} | {pd / dd:.2f}x faster | {span(('libtorch', model, 'plain', dtype))} | "
              f"{span(('libtorch', model, 'ddp', dtype))} |")
PY
