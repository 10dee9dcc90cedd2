#!/usr/bin/env bash
# One GPU: what leaving SMs free for the overlapped optimizer costs and gains (issue 33).
# For each workload, ddptrain's ms per step plain (one optimizer pass after backward), with
# --overlap-optimizer (each layer updated on a side stream as backward finishes it), and with
# --overlap-optimizer --product-sms S for each S of SMS (the products told to use S SMs, the
# others left to the updates); the configurations run in turn, ROUNDS times, best of rounds.
# Prints a Markdown table.
# Usage: [SMS="124 116 100"] [ROUNDS=2] scripts/bench-product-sms.sh BUILD_DIR [workload:precision ...]
#   default workloads: medium:bf16 large:bf16
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:?usage: scripts/bench-product-sms.sh BUILD_DIR [workload:precision ...]}"
shift
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(medium:bf16 large:bf16)
sms="${SMS:-124 116 100}"
rounds="${ROUNDS:-2}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tmp="$(mktemp -d)"
configs=("plain|" "overlap|--overlap-optimizer")
for s in $sms; do configs+=("overlap, $s SMs|--overlap-optimizer --product-sms $s"); done
header="| workload | prec |"; rule="|---|---|"
for c in "${configs[@]}"; do header+=" ${c%%|*} ms |"; rule+="---|"; done
echo "$header"; echo "$rule"
failed=0
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload" || exit 2
  declare -A best=()
  for ((r = 0; r < rounds; ++r)); do
    for c in "${configs[@]}"; do
      name="${c%%|*}"; flags="${c#*|}"
      # shellcheck disable=SC2086
      if timeout 180 "$build/bin/ddptrain" --device cuda --precision "$prec" --data synthetic \
        --layers "$layers" --batch-size "$batch" --synthetic-samples "$samples" --steps "$steps" \
        --log-every $((steps / 6)) --lr-schedule constant --lr 0.01 --quiet --autotune $flags \
        --metrics "$tmp/m.jsonl" > "$tmp/log" 2>&1; then
        ms="$(ddp_json "$tmp/m.jsonl" steady_samples_per_s | awk -v b="$batch" '{ printf "%.3f", 1e3 * b / $1 }')"
        prev="${best[$name]:-}"
        if [ -z "$prev" ] || awk -v a="$ms" -v b="$prev" 'BEGIN { exit !(a < b) }'; then best[$name]="$ms"; fi
      else
        echo "bench-product-sms: $run $name failed: $(tail -1 "$tmp/log")" >&2
        failed=1
      fi
    done
  done
  row="| $workload | $prec |"
  for c in "${configs[@]}"; do row+=" ${best[${c%%|*}]:--} |"; done
  echo "$row"
  unset best
done
echo "(commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); ms per step from the steady samples/s, best of $rounds rounds)"
exit $failed
