#!/usr/bin/env bash
# Two GPUs (or more), side by side in one run: ddprun + ddptrain (NCCL) against torchrun +
# PyTorch DistributedDataParallel (scripts/torch_mlp.py), same model, per-GPU batch, SGD
# momentum 0.9, precision, random inputs on the GPU; and each on one GPU, for the scaling
# efficiency. Also the time from launch to the first finished step, and ddptrain on every GPU
# with --grad-reduce bf16 (gradients sent as bfloat16). Prints a Markdown table.
# Usage: scripts/bench-ddp.sh BUILD_DIR [workload:precision ...]
#   default: tiny:tf32 tiny:bf16 medium:tf32 medium:bf16 large:tf32 large:bf16
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:-build}"
shift || true
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=("${ddp_default_runs[@]}")
py="${PYTHON:-python3}"
gpus="$(nvidia-smi -L | wc -l)"
tmp="$(mktemp -d)"
json() { ddp_json "$@"; }

printf '| workload | prec | ddptrain 1 GPU samples/s | ddptrain %d GPU samples/s | ddptrain scaling | PyTorch 1 GPU | PyTorch %d GPU | PyTorch scaling | ratio (%d GPU) | first step ddprun / torchrun | ddptrain %d GPU, bf16 gradients | its scaling |\n' "$gpus" "$gpus" "$gpus" "$gpus"
printf '|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload" || exit 2
  common=(--device cuda --precision "$prec" --data synthetic --layers "$layers" --steps "$steps"
          --log-every $((steps / 6)) --lr-schedule constant --lr 0.01 --quiet --autotune)
  timeout 200 "$build/bin/ddptrain" "${common[@]}" --batch-size "$batch" --synthetic-samples $((batch * 4)) \
    --metrics "$tmp/one.jsonl" > "$tmp/one.log" 2>&1 || { echo "ddptrain 1 GPU failed on $run"; tail -3 "$tmp/one.log"; continue; }
  timeout 300 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" "${common[@]}" \
    --batch-size $((batch * gpus)) --synthetic-samples $((batch * gpus * 4)) --metrics "$tmp/many.jsonl" \
    > "$tmp/many.log" 2>&1 || { echo "ddprun failed on $run"; tail -3 "$tmp/many.log"; continue; }
  # bf16 gradients where communication weighs (not tiny: 0.67 M parameters).
  echo '{"steady_samples_per_s": 0}' > "$tmp/bf16.jsonl"
  [ "$workload" = tiny ] || timeout 300 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" "${common[@]}" \
    --grad-reduce bf16 --batch-size $((batch * gpus)) --synthetic-samples $((batch * gpus * 4)) --metrics "$tmp/bf16.jsonl" \
    > "$tmp/bf16.log" 2>&1 || { echo "ddprun --grad-reduce bf16 failed on $run"; tail -3 "$tmp/bf16.log"; continue; }
  timeout 200 "$py" scripts/torch_mlp.py --device cuda --data random --precision "$prec" --layers "$layers" \
    --batch-size "$batch" --steps "$tsteps" --warmup 10 > "$tmp/t1.json" 2> "$tmp/t1.err" || { echo "torch 1 GPU failed"; tail -3 "$tmp/t1.err"; continue; }
  timeout 300 torchrun --nproc-per-node "$gpus" scripts/torch_mlp.py --device cuda --data random --precision "$prec" \
    --layers "$layers" --batch-size "$batch" --steps "$tsteps" --warmup 10 > "$tmp/tn.json" 2> "$tmp/tn.err" ||
    { echo "torchrun failed"; tail -3 "$tmp/tn.err"; continue; }
  "$py" - "$workload" "$prec" "$gpus" "$(json "$tmp/one.jsonl" steady_samples_per_s)" \
    "$(json "$tmp/many.jsonl" steady_samples_per_s)" "$(json "$tmp/t1.json" samples_per_s)" \
    "$(json "$tmp/tn.json" samples_per_s)" "$(json "$tmp/many.jsonl" since_launch_s)" "$(json "$tmp/tn.json" first_step_s)" \
    "$(json "$tmp/bf16.jsonl" steady_samples_per_s)" <<'PY'
import sys
w, p, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
o1, on, t1, tn, f_ours, f_torch, ob = map(float, sys.argv[4:11])
print(f"| {w} | {p} | {o1/1e3:.1f} k | {on/1e3:.1f} k | {100*on/(n*o1):.0f} % | {t1/1e3:.1f} k | {tn/1e3:.1f} k | "
      f"{100*tn/(n*t1):.0f} % | {on/tn:.2f} | {f_ours:.2f} s / {f_torch:.2f} s | " +
      (f"{ob/1e3:.1f} k | {100*ob/(n*o1):.0f} % |" if ob > 0 else "- | - |"))
PY
done
echo "(commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); per-GPU batch as in BENCHMARKS.md; ratio = ddptrain over PyTorch DDP samples/s on $gpus GPUs)"
rm -rf "$tmp"
