#!/usr/bin/env bash
# ZeRO's memory: the workload `large` of shared/BENCHMARKS.md (537 M parameters, global batch
# 4096) with AdamW over D data-parallel ranks, --zero 0, 1 and 2, and what rank 0 held on the
# GPU at the end (its `memory` metrics record: the allocations by kind, from the memory
# ledger). Ranks may share one GPU (--share-gpu: NCCL over sockets, slow, and memory is per
# process either way), so this is a memory figure, never a speed one.
# Prints a Markdown table. Usage: scripts/bench-zero-memory.sh BUILD_DIR [D] [--share-gpu]
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
ddp_workload large
failed=0
echo "| large, AdamW, D = $ranks | parameters | gradients | optimizer state | activations | all (GiB) |"
echo "|---|---|---|---|---|---|"
for zero in 0 1 2; do
  if timeout 400 "$build/bin/ddprun" --nproc-per-node "$ranks" $share -- "$build/bin/ddptrain" \
    --device cuda --data synthetic --layers "$layers" --batch-size "$batch" \
    --synthetic-samples "$batch" --optimizer adamw --precision tf32 --steps 3 --log-every 3 \
    --zero "$zero" --quiet --metrics "$tmp/z$zero.jsonl" > "$tmp/z$zero.log" 2>&1; then
    "$py" - "$tmp/z$zero.jsonl" "$zero" <<'PY' || failed=1
import json, sys
held = [json.loads(l) for l in open(sys.argv[1]) if '"memory"' in l][-1]["held"]
gib = lambda k: held.get(k, 0) / 2**30
print(f"| --zero {sys.argv[2]} | {gib('parameters'):.2f} | {gib('gradients'):.2f} | "
      f"{gib('optimizer state'):.2f} | {gib('activations'):.2f} | {sum(held.values()) / 2**30:.2f} |")
PY
  else
    echo "| --zero $zero | failed: $(grep -m1 -iE 'error|failed' "$tmp/z$zero.log") | | | | |"
    tail -5 "$tmp/z$zero.log" >&2
    failed=1
  fi
done
exit $failed
