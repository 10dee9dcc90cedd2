#!/usr/bin/env bash
# ZeRO for LibTorch modules against PyTorch's own on 2 CPU ranks (the command of issue 56's
# figures in docs/PERFORMANCE.md): the plain and ZeRO rows of scripts/bench-libtorch-ranks.sh
# for the 50 M-parameter MLP with AdamW, 3 steps a round of each rank's batch of 64.
# Usage: scripts/bench-libtorch-zero.sh BUILD_DIR [--steps N] [--batch N]
build="${1:?usage: scripts/bench-libtorch-zero.sh BUILD_DIR [--steps N] [--batch N]}"
shift
exec "$(dirname "$0")/bench-libtorch-ranks.sh" "$build" --cpu --ranks 2 --models mlp --runs plain,zero "$@"
