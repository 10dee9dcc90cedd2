#!/usr/bin/env bash
# One GPU, side by side in one run: ddptrain --device cuda against PyTorch eager (same model,
# batch, SGD momentum 0.9, precision, random inputs on the GPU) for the workloads of
# shared/BENCHMARKS.md, plus the cuBLAS time of the step's matrix products measured through
# PyTorch. Prints a Markdown table.
# Usage: scripts/bench-vs-torch.sh [BUILD_DIR] [workload:precision ...]
#   default: tiny:tf32 tiny:bf16 medium:tf32 medium:bf16 large:tf32 large:bf16
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:-build}"
shift || true
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=("${ddp_default_runs[@]}")
py="${PYTHON:-python3}"
tmp="$(mktemp -d)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

json() { ddp_json "$@"; }

printf '| workload | prec | ddptrain ms/step | PyTorch ms/step | ddptrain samples/s | PyTorch samples/s | ratio | cuBLAS ms (products) | products / ddptrain step |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload" || exit 2
  log_every=$((steps / 6))
  timeout 120 "$build/bin/ddptrain" --device cuda --precision "$prec" --data synthetic --layers "$layers" \
    --batch-size "$batch" --synthetic-samples "$samples" --steps "$steps" --log-every "$log_every" \
    --lr-schedule constant --lr 0.01 --quiet --autotune ${DDP_BENCH_FLAGS:-} --metrics "$tmp/ddp.jsonl" > "$tmp/ddp.log" 2>&1 ||
    { echo "ddptrain failed on $run:"; tail -5 "$tmp/ddp.log"; continue; }
  ours="$(json "$tmp/ddp.jsonl" steady_samples_per_s)"
  timeout 120 "$py" scripts/torch_mlp.py --device cuda --data random --precision "$prec" --layers "$layers" \
    --batch-size "$batch" --steps "$tsteps" --warmup 10 > "$tmp/torch.json" 2> "$tmp/torch.err" ||
    { echo "torch failed on $run:"; tail -5 "$tmp/torch.err"; continue; }
  theirs="$(json "$tmp/torch.json" samples_per_s)"
  "$py" scripts/torch_matmul_rate.py --layers "$layers" --batch-size "$batch" --precision "$prec" > "$tmp/mm.json"
  mm="$(json "$tmp/mm.json" matmul_ms)"
  "$py" - "$workload" "$prec" "$batch" "$ours" "$theirs" "$mm" <<'PY'
import sys
w, p, b, ours, theirs, mm = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
ours_ms, theirs_ms = 1e3 * b / ours, 1e3 * b / theirs
print(f"| {w} | {p} | {ours_ms:.3f} | {theirs_ms:.3f} | {ours/1e3:.1f} k | {theirs/1e3:.1f} k | {ours/theirs:.2f} | {mm:.3f} | {100*mm/ours_ms:.0f} % |")
PY
done
echo "(commit $commit; ratio = ddptrain samples/s over PyTorch's; last column = cuBLAS time of the step's products over ddptrain's whole step)"
rm -rf "$tmp"
