#!/usr/bin/env bash
# ZeRO's memory: the workload `large` of shared/BENCHMARKS.md (537 M parameters, global batch
# 4096) with AdamW over D data-parallel ranks, --zero 0 to 3 (LEVELS picks), and what rank 0 held on the
# GPU at the end (its `memory` metrics record: the allocations by kind, from the memory
# ledger). Ranks may share one GPU (--share-gpu: NCCL over sockets, slow, and memory is per
# process either way), so this is a memory figure, never a speed one. DEVICE=cpu: the CPU
# path (Gloo) with --zero 0 to 3 on a model of eight 1024 x 1024 layers (8.4 M parameters,
# global batch 64), its record counting the host buffers by kind.
# STEPS (default 3): steps a run; with 30 or more the steady samples/s and its ratio to --zero 0's
# are the speed figures of ZeRO at dp D (a GPU a rank: never with --share-gpu).
# Prints a Markdown table. Usage: [DEVICE=cpu] [LEVELS="0 1 2 3"] [STEPS=3] scripts/bench-zero-memory.sh BUILD_DIR [D] [--share-gpu]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:-build}"
ranks="${2:-2}"
share="${3:-}"
py="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
device="${DEVICE:-cuda}"
levels="0 1 2 3"
name=large
ddp_workload large
extra=(--precision tf32)
if [ "$device" = cpu ]; then
  name="8 x 1024 (CPU)"
  layers=1024,1024,1024,1024,1024,1024,1024,1024,1024,10
  batch=64
  extra=(--threads 1)
  export CUDA_VISIBLE_DEVICES=
fi
levels="${LEVELS:-$levels}"  # LEVELS="0 3": some of them
failed=0
unit=GiB
[ "$device" = cpu ] && unit=MiB
steps="${STEPS:-3}"
every=$((steps / 3 > 0 ? steps / 3 : 1))
echo "| $name, AdamW, D = $ranks ($unit) | parameters | gradients | optimizer state | activations | all | samples/s | vs --zero 0 |"
echo "|---|---|---|---|---|---|---|---|"
plain_rate=""
for zero in $levels; do
  if timeout 400 "$build/bin/ddprun" --nproc-per-node "$ranks" $share -- "$build/bin/ddptrain" \
    --device "$device" --data synthetic --layers "$layers" --batch-size "$batch" \
    --synthetic-samples "$batch" --optimizer adamw "${extra[@]}" --steps "$steps" --log-every "$every" \
    --zero "$zero" --quiet --metrics "$tmp/z$zero.jsonl" > "$tmp/z$zero.log" 2>&1; then
    row="$("$py" - "$tmp/z$zero.jsonl" "$zero" "$unit" "$plain_rate" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
held = [r for r in records if r.get("event") == "memory"][-1]["held"]
rates = [r["steady_samples_per_s"] for r in records if "steady_samples_per_s" in r]
rate = rates[-1] if rates else None
scale = 2**30 if sys.argv[3] == "GiB" else 2**20
size = lambda k: held.get(k, 0) / scale
plain = float(sys.argv[4]) if sys.argv[4] else None
print(f"{rate or ''}\t| --zero {sys.argv[2]} | {size('parameters'):.2f} | {size('gradients'):.2f} | "
      f"{size('optimizer state'):.2f} | {size('activations'):.2f} | "
      f"{sum(held.values()) / scale:.2f} | {f'{rate:.0f}' if rate else '-'} | "
      f"{f'{rate / plain:.3f}x' if rate and plain else '-'} |")
PY
)" || failed=1
    [ "$zero" = 0 ] && plain_rate="${row%%$'\t'*}"
    echo "${row#*$'\t'}"
  else
    echo "| --zero $zero | failed: $(grep -m1 -iE 'error|failed' "$tmp/z$zero.log") | | | | | | |"
    tail -5 "$tmp/z$zero.log" >&2
    failed=1
  fi
done
exit $failed
