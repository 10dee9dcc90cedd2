#!/usr/bin/env bash
# The LibTorch wrapper's cost (issues 44 and 58), in one run: a training step of the example's
# network (cnn, batch 64), of a 50 M-parameter MLP (mlp, batch 512), of ResNet-18 as for
# CIFAR-10 (resnet, batch 128) and of 4 transformer blocks of width 1024 (transformer, batch 16
# of 256 tokens), each in float32 and in bfloat16 (the model in bf16): plain LibTorch against
# ddp::DistributedDataParallel on one rank (ddp_torch_bench), and the same in Python, plain
# PyTorch against PyTorch's DistributedDataParallel on one rank (tests/libtorch/torch_bench.py).
# Each pair runs in one process (--mode both) with --reps rounds (10) of --steps steps each
# (by default about half a second a round on an H100, which the script knows per model),
# plain and wrapped alternating, so that drift (clocks, the machine's other work) hits both
# alike: the table gives the medians (ms a step), the wrapper's overhead as the median of the
# rounds' pairs (round k wrapped / round k plain) with the middle half of those pairs, and the
# plain and wrapped ranges.
# Usage: scripts/bench-libtorch.sh BUILD_DIR [--cpu] [--steps N] [--reps N] [--models LIST]
#     [--dtypes LIST]
#   the GPU by default; LIST: comma-separated (cnn,mlp,resnet,transformer; fp32,bf16: all by
#   default); DDP_PYTHON: the Python with torch (else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-libtorch.sh BUILD_DIR [--cpu] [--steps N] [--reps N] [--models LIST] [--dtypes LIST]}"
shift
cuda=--cuda
steps=auto
reps=10
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
    n="$steps"
    # auto: a round of about half a second on an H100 (shorter rounds of a launch-bound step
    # moved by 10-30 % from round to round there); 20 steps on the CPU.
    if [ "$n" = auto ]; then
      case "$cuda $model $dtype" in
        " "*) n=20 ;;
        *" cnn "*) n=400 ;;
        *" mlp fp32") n=150 ;;
        *" mlp bf16") n=400 ;;
        *" resnet "*) n=60 ;;
        *" transformer fp32") n=20 ;;
        *" transformer bf16") n=60 ;;
      esac
    fi
    "$bench" --model $model --mode both $cuda --steps "$n" --rounds "$reps" --dtype $dtype |
      tee -a "$results"
    # PyTorch's Gloo has no bf16 broadcast (1.13): no Python DDP reference on the CPU in bf16.
    pymode=both
    [ -z "$cuda" ] && [ $dtype = bf16 ] && pymode=plain
    MASTER_PORT=$((29500 + RANDOM % 1000)) "$py" tests/libtorch/torch_bench.py --model $model \
      --mode $pymode $cuda --steps "$n" --rounds "$reps" --dtype $dtype | tee -a "$results"
  done
done
"$py" - "$results" "$models" "$dtypes" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) (\w+) (\w+)( bf16)?: ms_per_step [0-9.]+ rounds ([0-9. ]+)", line)
    if m:
        key = (m.group(1), m.group(2), m.group(3), "bf16" if m.group(4) else "fp32")
        runs[key] = [float(t) for t in m.group(5).split()]
nan = float("nan")
med = lambda k: statistics.median(runs[k]) if k in runs else nan
def pairs(side, model, dtype):
    """The wrapped run's overhead: the median of the rounds' ratios and their middle half."""
    plain, wrapped = runs[(side, model, "plain", dtype)], runs[(side, model, "ddp", dtype)]
    ratios = sorted(100 * (w / p - 1) for p, w in zip(plain, wrapped))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"{statistics.median(ratios):+.1f} % ({q[0]:+.1f} to {q[2]:+.1f})"
print("| model | dtype | LibTorch | ddp::DistributedDataParallel | overhead (middle half of the pairs) | PyTorch | PyTorch DDP | ddp C++ vs PyTorch DDP | LibTorch range | wrapped range |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in sys.argv[2].split(","):
    for dtype in sys.argv[3].split(","):
        lt, dd = med(("libtorch", model, "plain", dtype)), med(("libtorch", model, "ddp", dtype))
        pt, pd = med(("pytorch", model, "plain", dtype)), med(("pytorch", model, "ddp", dtype))
        span = lambda k: f"{min(runs[k]):.4f}-{max(runs[k]):.4f}"
        print(f"| {model} | {dtype} | {lt:.4f} | {dd:.4f} | {pairs('libtorch', model, dtype)} | {pt:.4f} | "
              f"{pd:.4f} | {pd / dd:.2f}x faster | {span(('libtorch', model, 'plain', dtype))} | "
              f"{span(('libtorch', model, 'ddp', dtype))} |")
PY
