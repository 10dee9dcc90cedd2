#!/usr/bin/env bash
# One GPU: what leaving SMs free for the overlapped optimizer costs and gains (issue 33).
# For each workload, ddptrain's ms per step plain (one optimizer pass after backward), with
# --overlap-optimizer (each layer updated on a side stream as backward finishes it), and with
# --overlap-optimizer --product-sms S for each S of SMS (the products told to use S SMs, the
# others left to the updates): scripts/bench-flags.sh with these configurations (in turn,
# ROUNDS times, the median of the rounds). Prints a Markdown table.
# Usage: [SMS="124 116 100"] [ROUNDS=2] scripts/bench-product-sms.sh BUILD_DIR [workload:precision ...]
#   default workloads: medium:bf16 large:bf16
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-product-sms.sh BUILD_DIR [workload:precision ...]}"
shift
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(medium:bf16 large:bf16)
configs=("plain=" "overlap=--overlap-optimizer")
for s in ${SMS:-124 116 100}; do configs+=("overlap, $s SMs=--overlap-optimizer --product-sms $s"); done
ROUNDS="${ROUNDS:-2}" exec scripts/bench-flags.sh "$build" "${configs[@]}" -- "${runs[@]}"
