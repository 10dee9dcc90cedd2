#!/usr/bin/env bash
# Two builds' ddptrain on one GPU, speed only (no PyTorch): for each workload of
# shared/BENCHMARKS.md, old and new in turn, ROUNDS times (default 2), so that drift over the
# run hits both alike; prints each build's best steady samples/s and new over old. What
# "speed within 2 %" of an engine change is checked with when bench-against.sh's PyTorch
# side does not fit the call.
# Usage: scripts/bench-builds.sh OLD_BUILD NEW_BUILD [workload:precision ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
old="${1:?usage: scripts/bench-builds.sh OLD_BUILD NEW_BUILD [workload:precision ...]}"
new="${2:?usage: scripts/bench-builds.sh OLD_BUILD NEW_BUILD [workload:precision ...]}"
shift 2
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=("${ddp_default_runs[@]}")
for b in "$old" "$new"; do
  [ -x "$b/bin/ddptrain" ] || { echo "bench-builds: $b/bin/ddptrain: not built" >&2; exit 2; }
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf '| workload | prec | old samples/s | new samples/s | new / old |\n|---|---|---|---|---|\n'
status=0
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload" || exit 2
  declare -A best=([old]=0 [new]=0)
  for _ in $(seq "${ROUNDS:-2}"); do
    for side in old new; do
      b="$old"; [ "$side" = new ] && b="$new"
      # Each build its own --autotune cache, filled by its first round.
      DDP_CACHE_DIR="$b/ddp-cache" timeout 300 "$b/bin/ddptrain" --device cuda --precision "$prec" \
        --data synthetic --layers "$layers" --batch-size "$batch" --synthetic-samples "$samples" \
        --steps "$steps" --log-every $((steps / 6)) --lr-schedule constant --lr 0.01 --quiet \
        --autotune --metrics "$tmp/m.jsonl" > "$tmp/log" 2>&1 ||
        { echo "bench-builds: $side failed on $run:"; tail -3 "$tmp/log"; status=1; continue; }
      v="$(ddp_json "$tmp/m.jsonl" steady_samples_per_s)"
      best[$side]="$(awk -v a="${best[$side]}" -v b="$v" 'BEGIN { print (b > a ? b : a) }')"
    done
  done
  printf '| %s | %s | %.0f | %.0f | %.3f |\n' "$workload" "$prec" "${best[old]}" "${best[new]}" \
    "$(awk -v a="${best[old]}" -v b="${best[new]}" 'BEGIN { print (a > 0 ? b / a : 0) }')"
done
exit $status
