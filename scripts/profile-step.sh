#!/usr/bin/env bash
# Where one GPU's training step goes, for the workloads of shared/BENCHMARKS.md: ddptrain
# (--autotune, as bench-vs-torch.sh runs it) once plain for the step's wall time, then under
# Nsight Systems with --profile-steps over steps in its steady middle, and the kernels of that
# capture range summed by kind a step (scripts/nsys_step_summary.py: the products, the
# optimizer, the bf16 copies, the loss, ...), against the limits measured here
# (scripts/torch_matmul_rate.py, where PyTorch is) and against the wall time (what the GPU
# left idle). The reports stay in PROFILE_DIR (default BUILD_DIR/profiles) for nsys-ui.
# Usage: scripts/profile-step.sh [BUILD_DIR] [workload:precision ...]
#   default: medium:tf32 medium:bf16 large:tf32 large:bf16
#   exit 0, 1 (a run failed), 2 (bad arguments), 77 (no nsys here)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:-build}"
shift || true
[ -x "$build/bin/ddptrain" ] || { echo "BUILD_DIR $build: no bin/ddptrain there (build first)" >&2; exit 2; }
build="$(cd "$build" && pwd)"
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(medium:tf32 medium:bf16 large:tf32 large:bf16)
nsys="$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)"
[ -n "$nsys" ] || { echo "skipped: no nsys here (Nsight Systems)"; exit 77; }
py="${PYTHON:-python3}"
export DDP_CACHE_DIR="${DDP_CACHE_DIR:-$build/ddp-cache}"
reports="${PROFILE_DIR:-$build/profiles}"
mkdir -p "$reports"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
commit="${DDP_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
status=0
for run in "${runs[@]}"; do
  workload="${run%%:*}"; prec="${run##*:}"
  ddp_workload "$workload" || exit 2
  args=(--device cuda --precision "$prec" --data synthetic --layers "$layers" --batch-size "$batch"
        --synthetic-samples "$samples" --steps "$steps" --log-every $((steps / 6))
        --lr-schedule constant --lr 0.01 --quiet --autotune ${DDP_BENCH_FLAGS:-})
  # Steps in the steady middle of the run: after the first, eager one, the graph's capture
  # and the first window.
  first=$((steps / 2 + 1))
  count=$((steps / 6 < 20 ? steps / 6 : 20))
  last=$((first + count - 1))
  if ! timeout 300 "$build/bin/ddptrain" "${args[@]}" --metrics "$tmp/plain.jsonl" > "$tmp/plain.log" 2>&1; then
    echo "ddptrain failed on $run:"; tail -5 "$tmp/plain.log"; status=1; continue
  fi
  step_ms="$("$py" -c "import sys; print(1e3 * $batch / float(sys.argv[1]))" "$(ddp_json "$tmp/plain.jsonl" steady_samples_per_s)")"
  rep="$reports/$workload-$prec"
  if ! timeout 400 "$nsys" profile --capture-range=cudaProfilerApi --capture-range-end=stop -t cuda \
      --cuda-graph-trace=node --force-overwrite true -o "$rep" \
      "$build/bin/ddptrain" "${args[@]}" --profile-steps "$first-$last" > "$tmp/nsys.log" 2>&1; then
    echo "nsys profile failed on $run:"; tail -5 "$tmp/nsys.log"; status=1; continue
  fi
  "$nsys" stats --report cuda_gpu_kern_sum --format csv --force-export true "$rep.nsys-rep" > "$tmp/kern.csv" 2> "$tmp/stats.err" ||
    { echo "nsys stats failed on $run: $(tail -1 "$tmp/stats.err")"; status=1; continue; }
  limits=()
  if "$py" scripts/torch_matmul_rate.py --layers "$layers" --batch-size "$batch" --precision "$prec" > "$tmp/limits.json" 2> /dev/null; then
    limits=(--limits "$tmp/limits.json")
  fi
  echo "### $workload $prec: steps $first-$last of $steps (batch $batch), report $rep.nsys-rep"
  echo
  "$py" scripts/nsys_step_summary.py "$tmp/kern.csv" --steps "$count" --step-ms "$step_ms" "${limits[@]}" || status=1
  echo
done
echo "(commit $commit; ms a step = the kernels' time in the capture range over its steps; the step's"
echo " wall time from the run without nsys; limits from scripts/torch_matmul_rate.py in this run)"
exit $status
