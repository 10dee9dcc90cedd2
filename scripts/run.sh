#!/usr/bin/env bash
# The README's run command: installs what is missing, builds, then trains the MLP
# 784-512-512-10 on Fashion-MNIST (SGD momentum 0.9, lr 0.05 cosine, global batch 128,
# 20 epochs) with data parallelism: ddprun starts one worker per local GPU, or two CPU
# workers (one OpenBLAS thread each) when there is no GPU. Extra arguments go to ddptrain
# (e.g. --epochs 2, --metrics run.jsonl, --precision tf32).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ddp_install_deps
ddp_build
bin="${DDP_BUILD_DIR:-build}/bin"
model=(--data fashion --layers 784,512,512,10 --batch-size 128 --epochs 20 --lr 0.05 --lr-schedule cosine
       --momentum 0.9)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$bin/ddptrain" --version | grep -q "cuda yes"; then
  exec "$bin/ddprun" --nproc-per-node gpu -- "$bin/ddptrain" --device cuda "${model[@]}" "$@"
fi
exec "$bin/ddprun" --nproc-per-node 2 -- "$bin/ddptrain" --threads 1 "${model[@]}" "$@"
