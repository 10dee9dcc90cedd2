#!/usr/bin/env bash
# CPU training throughput, side by side in one run: ddptrain against PyTorch (Debian's
# python3-torch) on the same model, data, optimizer, batch and thread count.
# Usage: scripts/bench-cpu.sh [epochs] (default 3). Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ddp_install_deps python3-torch python3-numpy
ddp_build >/dev/null
epochs="${1:-3}"
py=/usr/bin/python3  # Debian's interpreter, where python3-torch lives
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
printf '| implementation | threads | epochs | samples/s | test accuracy | ratio |\n'
printf '|---|---|---|---|---|---|\n'
for threads in 1 2; do
  torch_json="$(OMP_NUM_THREADS=$threads $py scripts/torch_mlp.py --epochs "$epochs" --threads "$threads")"
  torch_rate="$(echo "$torch_json" | $py -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])')"
  torch_acc="$(echo "$torch_json" | $py -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')"
  torch_ver="$(echo "$torch_json" | $py -c 'import json,sys; print(json.load(sys.stdin)["impl"])')"
  metrics="$(mktemp)"
  build/bin/ddptrain --epochs "$epochs" --threads "$threads" --quiet --metrics "$metrics" >/dev/null
  ddp_rate="$($py -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["samples_per_s"])' "$metrics")"
  ddp_acc="$($py -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["test_accuracy"])' "$metrics")"
  rm -f "$metrics"
  printf '| %s | %s | %s | %.0f | %.2f %% | 1.00 |\n' "$torch_ver" "$threads" "$epochs" "$torch_rate" \
    "$($py -c "print(100*$torch_acc)")"
  printf '| ddptrain %s | %s | %s | %.0f | %.2f %% | %.2f |\n' "$commit" "$threads" "$epochs" "$ddp_rate" \
    "$($py -c "print(100*$ddp_acc)")" "$($py -c "print($ddp_rate/$torch_rate)")"
done
