#!/usr/bin/env bash
# The README's run command: installs what is missing (where it can), builds, then trains the
# MLP 784-512-512-10 on Fashion-MNIST (SGD momentum 0.9, lr 0.05 cosine, global batch 128,
# 20 epochs) with data parallelism: ddprun starts one worker per local GPU, or two CPU
# workers (one OpenBLAS thread each) when there is no GPU. Extra arguments go to ddptrain
# (e.g. --epochs 2, --metrics run.jsonl, --precision tf32, --data-dir DIR, --data synthetic).
# The dataset is looked for in --data-dir, then $DDP_DATA_DIR, then Debian's
# /usr/share/datasets/fashion-mnist.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ddp_install_deps
ddp_build
bin="${DDP_BUILD_DIR:-build}/bin"

# Which data: an explicit --data other than fashion, or --data-dir, is the user's choice.
data="fashion"
data_dir=""
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --data) data="${args[i + 1]:-}" ;;
    --data=*) data="${args[i]#--data=}" ;;
    --data-dir) data_dir="${args[i + 1]:-}" ;;
    --data-dir=*) data_dir="${args[i]#--data-dir=}" ;;
  esac
done
extra=()
if [ "$data" = "fashion" ] && [ -z "$data_dir" ]; then
  looked=()
  for candidate in "${DDP_DATA_DIR:-}" /usr/share/datasets/fashion-mnist; do
    [ -n "$candidate" ] || continue
    looked+=("$candidate")
    if [ -f "$candidate/train-images-idx3-ubyte.gz" ]; then
      data_dir="$candidate"
      break
    fi
  done
  if [ -z "$data_dir" ]; then
    echo "run.sh: Fashion-MNIST not found (looked in: ${looked[*]}; each needs the four IDX .gz files)." >&2
    echo "run.sh: get it with 'sudo apt-get install dataset-fashion-mnist', or copy the four files" >&2
    echo "run.sh: into a folder and pass --data-dir DIR (or set DDP_DATA_DIR); or train on" >&2
    echo "run.sh: generated data instead: scripts/run.sh --data synthetic --layers 784,512,512,10" >&2
    exit 2
  fi
  extra=(--data-dir "$data_dir")
fi

# The run's metrics go to runs/ unless --metrics names a file; a plot is drawn next to them.
metrics=""
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --metrics) metrics="${args[i + 1]:-}" ;;
    --metrics=*) metrics="${args[i]#--metrics=}" ;;
  esac
done
if [ -z "$metrics" ]; then
  mkdir -p runs
  metrics="runs/run-$(date +%Y%m%d-%H%M%S).jsonl"
  extra+=(--metrics "$metrics")
fi

model=(--data fashion --layers 784,512,512,10 --batch-size 128 --epochs 20 --lr 0.05 --lr-schedule cosine
       --momentum 0.9 --eval-every 1000 "${extra[@]}")
status=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$bin/ddptrain" --version | grep -q "cuda yes"; then
  "$bin/ddprun" --nproc-per-node gpu -- "$bin/ddptrain" --device cuda "${model[@]}" "$@" || status=$?
else
  "$bin/ddprun" --nproc-per-node 2 -- "$bin/ddptrain" --threads 1 "${model[@]}" "$@" || status=$?
fi
[ "$status" -eq 0 ] || exit "$status"

py="$(ddp_python_with matplotlib || true)"
if [ -n "$py" ] && [ -s "$metrics" ]; then
  "$py" scripts/plot_metrics.py "$metrics" -o "${metrics%.jsonl}.png" >/dev/null &&
    echo "run.sh: metrics in $metrics, plot in ${metrics%.jsonl}.png"
else
  echo "run.sh: metrics in $metrics (no plot: install python3-matplotlib)"
fi
