#!/usr/bin/env bash
# The README's run command: installs what is missing, builds, then trains the MLP
# 784-512-512-10 on Fashion-MNIST (SGD momentum 0.9, lr 0.05 cosine, batch 128, 15 epochs).
# Extra arguments go to ddptrain (e.g. --epochs 2, --metrics run.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ddp_install_deps
ddp_build
exec "${DDP_BUILD_DIR:-build}/bin/ddptrain" --data fashion --layers 784,512,512,10 \
  --batch-size 128 --epochs 15 --lr 0.05 --lr-schedule cosine --momentum 0.9 "$@"
