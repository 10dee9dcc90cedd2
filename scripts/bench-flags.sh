#!/usr/bin/env bash
# One GPU: ddptrain's step under several sets of flags, side by side, on the workloads of
# shared/BENCHMARKS.md (as bench-vs-torch.sh runs them: --autotune, synthetic data). The
# configurations run in turn, ROUNDS times, so that the GPU's clock and neighbours weigh on
# each alike; each cell is the median of the rounds' ms a step (from the steady samples/s),
# with the fastest and slowest round. Prints a Markdown table; exits 1 when a run failed.
# Usage: [ROUNDS=3] scripts/bench-flags.sh BUILD_DIR NAME=FLAGS [NAME=FLAGS ...] [-- workload:precision ...]
#   e.g. scripts/bench-flags.sh build-gpu "one stream=--weight-grad-stream off" \
#          "beside=--weight-grad-stream on" -- tiny:tf32 tiny:bf16
#   default workloads: tiny:tf32 tiny:bf16
#   DDP_COMMIT: the commit the table names (default: git's HEAD)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
usage="usage: scripts/bench-flags.sh BUILD_DIR NAME=FLAGS [NAME=FLAGS ...] [-- workload:precision ...]"
build="${1:?$usage}"
shift
[ -x "$build/bin/ddptrain" ] || { echo "BUILD_DIR $build: no bin/ddptrain there (build first)" >&2; exit 2; }
configs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    ?*=*) configs+=("$1") ;;
    *) echo "bench-flags: '$1': expected NAME=FLAGS (a name for the column, then ddptrain's flags)" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = -- ] && shift
[ ${#configs[@]} -ge 1 ] || { echo "$usage" >&2; exit 2; }
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(tiny:tf32 tiny:bf16)
rounds="${ROUNDS:-3}"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS $rounds: expected a count of rounds, 1 or more" >&2; exit 2; }
for run in "${runs[@]}"; do ddp_workload "${run%%:*}" || exit 2; done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DDP_CACHE_DIR="${DDP_CACHE_DIR:-$build/ddp-cache}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
header="| workload | prec |"; rule="|---|---|"
for c in "${configs[@]}"; do header+=" ${c%%=*} ms |"; rule+="---|"; done
echo "$header"; echo "$rule"
failed=0
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload"
  for ((r = 0; r < rounds; ++r)); do
    for i in "${!configs[@]}"; do
      flags="${configs[$i]#*=}"
      # shellcheck disable=SC2086
      if timeout 300 "$build/bin/ddptrain" --device cuda --precision "$prec" --data synthetic \
        --layers "$layers" --batch-size "$batch" --synthetic-samples "$samples" --steps "$steps" \
        --log-every $((steps / 6)) --lr-schedule constant --lr 0.01 --quiet --autotune $flags \
        --metrics "$tmp/m.jsonl" > "$tmp/log" 2>&1; then
        ddp_json "$tmp/m.jsonl" steady_samples_per_s | awk -v b="$batch" '{ printf "%.4f\n", 1e3 * b / $1 }' >> "$tmp/$i"
      else
        echo "bench-flags: $run '${configs[$i]%%=*}' failed: $(tail -1 "$tmp/log")" >&2
        failed=1
      fi
      rm -f "$tmp/m.jsonl"
    done
  done
  row="| $workload | $prec |"
  for i in "${!configs[@]}"; do
    if [ -s "$tmp/$i" ]; then
      row+=" $(sort -g "$tmp/$i" | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
        printf "%.4f (%.4f-%.4f)", m, v[1], v[NR] }') |"
    else
      row+=" - |"
    fi
    rm -f "$tmp/$i"
  done
  echo "$row"
done
echo "(commit ${DDP_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; ms a step, median of $rounds rounds (fastest-slowest), the configurations in turn each round)"
exit $failed
