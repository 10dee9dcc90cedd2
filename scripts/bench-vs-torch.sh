#!/usr/bin/env bash
# One GPU, side by side in one run: ddptrain --device cuda against PyTorch (same model, batch,
# SGD momentum 0.9, precision, random inputs on the GPU, scripts/torch_mlp.py) eager, at its
# best (fused SGD, the whole step in one CUDA graph: --mode graph) and through torch.compile
# (max-autotune-no-cudagraphs, then the step in a graph: --mode compile), for the workloads
# of shared/BENCHMARKS.md; the cuBLAS time of the step's products through PyTorch and the
# step's limit on this GPU (torch_matmul_rate.py: its FLOPs at the peak product rate plus the
# optimizer's bytes at the copy bandwidth, both measured here) with ddptrain's share of it.
# Prints a Markdown table.
# Usage: scripts/bench-vs-torch.sh [--warm] [BUILD_DIR] [workload:precision ...]
#   default: tiny:tf32 tiny:bf16 medium:tf32 medium:bf16 large:tf32 large:bf16
#   --warm: only fill the caches that make a later run quick, timing nothing: torch.compile's
#     (its autotuned kernels; TORCHINDUCTOR_CACHE_DIR, default BUILD_DIR/torchinductor-cache)
#     and ddptrain's --autotune choices (DDP_CACHE_DIR, default BUILD_DIR/ddp-cache). The six
#     workloads took about 450 s, nearly all compiling (tiny 80 to 95 s and medium 100 to 165 s
#     a precision; large is not compiled): warm in one device call and run the table in the
#     next on the same machine.
#   TORCH_MODES: the PyTorch modes besides eager (default "graph compile"; "" for eager only);
#     compile is left out on large (scripts/workloads.sh says why) unless TORCH_COMPILE_ALL=1
#   DDP_COMMIT: the commit the table names (default: git's HEAD)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
warm=0
[ "${1:-}" = --warm ] && { warm=1; shift; }
build="${1:-build}"
shift || true
[ -x "$build/bin/ddptrain" ] || { echo "BUILD_DIR $build: no bin/ddptrain there (build first)" >&2; exit 2; }
build="$(cd "$build" && pwd)"
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=("${ddp_default_runs[@]}")
py="${PYTHON:-python3}"
modes="${TORCH_MODES-graph compile}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$build/torchinductor-cache}"
export DDP_CACHE_DIR="${DDP_CACHE_DIR:-$build/ddp-cache}"
tmp="$(mktemp -d)"
# DDP_COMMIT: the commit to name where the tree has no git history of its own (a copy).
commit="${DDP_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

json() { ddp_json "$@"; }
# The PyTorch modes for the current workload: TORCH_MODES, less compile where it does not compile.
workload_modes() {
  local mode picked=()
  for mode in $modes; do
    [ "$mode" = compile ] && [ "$compiles" = 0 ] && [ "${TORCH_COMPILE_ALL:-0}" != 1 ] && continue
    picked+=("$mode")
  done
  echo "${picked[*]}"
}
# PyTorch's ms per step in MODE for the current workload, or "-" (its error on stderr).
torch_ms() {
  local mode="$1"
  if timeout 600 "$py" scripts/torch_mlp.py --device cuda --data random --precision "$prec" --layers "$layers" \
    --batch-size "$batch" --steps "$tsteps" --warmup 10 --mode "$mode" > "$tmp/torch-$mode.json" 2> "$tmp/torch-$mode.err"; then
    json "$tmp/torch-$mode.json" ms_per_step
  else
    echo "torch --mode $mode failed on $run: $(tail -1 "$tmp/torch-$mode.err")" >&2
    echo "-"
  fi
}

if [ "$warm" = 1 ]; then
  for run in "${runs[@]}"; do
    workload="${run%%:*}"; prec="${run##*:}"
    ddp_workload "$workload" || exit 2
    started=$SECONDS
    timeout 300 "$build/bin/ddptrain" --device cuda --precision "$prec" --data synthetic --layers "$layers" \
      --batch-size "$batch" --synthetic-samples "$samples" --steps 2 --quiet --autotune ${DDP_BENCH_FLAGS:-} > "$tmp/ddp.log" 2>&1 ||
      { echo "ddptrain failed on $run:"; tail -5 "$tmp/ddp.log"; exit 1; }
    case " $(workload_modes) " in
      *" compile "*)
        timeout 600 "$py" scripts/torch_mlp.py --device cuda --data random --precision "$prec" --layers "$layers" \
          --batch-size "$batch" --steps 1 --warmup 2 --mode compile > /dev/null 2> "$tmp/torch.err" ||
          { echo "torch --mode compile failed on $run: $(tail -1 "$tmp/torch.err")"; exit 1; } ;;
    esac
    echo "warmed $run in $((SECONDS - started)) s"
  done
  echo "caches: $TORCHINDUCTOR_CACHE_DIR, $DDP_CACHE_DIR"
  rm -rf "$tmp"
  exit 0
fi

printf '| workload | prec | ddptrain ms/step | PyTorch ms/step | ddptrain samples/s | PyTorch samples/s | ratio | PyTorch graph ms | torch.compile ms | cuBLAS ms (products) | products / ddptrain step | limit ms | ddptrain at %% of limit | ddptrain vs best |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload" || exit 2
  log_every=$((steps / 6))
  timeout 120 "$build/bin/ddptrain" --device cuda --precision "$prec" --data synthetic --layers "$layers" \
    --batch-size "$batch" --synthetic-samples "$samples" --steps "$steps" --log-every "$log_every" \
    --lr-schedule constant --lr 0.01 --quiet --autotune ${DDP_BENCH_FLAGS:-} --metrics "$tmp/ddp.jsonl" > "$tmp/ddp.log" 2>&1 ||
    { echo "ddptrain failed on $run:"; tail -5 "$tmp/ddp.log"; continue; }
  ours="$(json "$tmp/ddp.jsonl" steady_samples_per_s)"
  eager="$(torch_ms eager)"
  [ "$eager" = "-" ] && continue
  graph="-"; compiled="-"
  for mode in $(workload_modes); do
    case "$mode" in
      graph) graph="$(torch_ms graph)" ;;
      compile) compiled="$(torch_ms compile)" ;;
      *) echo "TORCH_MODES: unknown mode $mode (expected graph or compile)" >&2; exit 2 ;;
    esac
  done
  "$py" scripts/torch_matmul_rate.py --layers "$layers" --batch-size "$batch" --precision "$prec" > "$tmp/mm.json"
  mm="$(json "$tmp/mm.json" matmul_ms)"
  limit="$(json "$tmp/mm.json" limit_ms)"
  "$py" - "$workload" "$prec" "$batch" "$ours" "$eager" "$graph" "$compiled" "$mm" "$limit" <<'PY'
import sys
w, p, b = sys.argv[1], sys.argv[2], int(sys.argv[3])
ours = float(sys.argv[4])
eager, mm, limit = float(sys.argv[5]), float(sys.argv[8]), float(sys.argv[9])
graph = None if sys.argv[6] == "-" else float(sys.argv[6])
compiled = None if sys.argv[7] == "-" else float(sys.argv[7])
ours_ms = 1e3 * b / ours
theirs = 1e3 * b / eager
best = min(t for t in (eager, graph, compiled) if t is not None)
fmt = lambda t: "-" if t is None else f"{t:.3f}"
print(f"| {w} | {p} | {ours_ms:.3f} | {eager:.3f} | {ours/1e3:.1f} k | {theirs/1e3:.1f} k | {ours/theirs:.2f} | "
      f"{fmt(graph)} | {fmt(compiled)} | {mm:.3f} | {100*mm/ours_ms:.0f} % | {limit:.3f} | "
      f"{100*limit/ours_ms:.0f} % | {best/ours_ms:.2f}x |")
PY
done
echo "(commit $commit; PyTorch ms/step and samples/s: eager; ratio = ddptrain samples/s over eager PyTorch's;"
echo " products / ddptrain step = cuBLAS time of the step's products over ddptrain's step; limit = FLOPs at"
echo " the measured peak product rate + optimizer bytes at the measured copy bandwidth;"
echo " vs best = the fastest PyTorch mode's ms over ddptrain's; torch.compile \"-\" on large: not compiled there,"
echo " scripts/workloads.sh says why)"
rm -rf "$tmp"
