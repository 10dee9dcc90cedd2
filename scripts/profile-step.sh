#!/usr/bin/env bash
# Where one GPU's training step goes, for the workloads of shared/BENCHMARKS.md, beside
# PyTorch's best step (fused SGD, the whole step in one CUDA graph). ddptrain (--autotune, as
# bench-vs-torch.sh runs it) and scripts/torch_mlp.py --mode graph each run once plain for the
# step's wall time, then under a profiler over steps of their steady middle (ddptrain
# --profile-steps, torch_mlp.py --profile-steps: a cudaProfilerStart/Stop range), and the
# kernels of that range are summed by kind a step (scripts/step_kernel_summary.py: the
# products, the optimizer, the bf16 casts, the loss, ...), against the limits measured here
# (scripts/torch_matmul_rate.py) and against the wall time (what the GPU left idle).
# The profiler: Nsight Compute (ncu, each kernel's gpu__time_duration; it leaves the clocks and
# caches as they are: --clock-control none --cache-control none), which works on the GPU
# machine, or Nsight Systems (nsys), which cannot make reports there. What the profiler wrote
# is kept in PROFILE_DIR (default BUILD_DIR/profiles): ncu's CSV of every kernel, nsys's reports. ncu runs kernels one at a time, so its sum is of kernels alone, overlap not
# counted.
# Usage: scripts/profile-step.sh [BUILD_DIR] [workload:precision ...]
#   default: medium:tf32 medium:bf16 large:tf32 large:bf16
#   PROFILER: ncu or nsys (default: ncu where found, else nsys)
#   PROFILE_STEPS: steps profiled (default 5 under ncu; under nsys a sixth of the run, at most 20)
#   TORCH_MODE: PyTorch's mode beside ddptrain (default graph; "" leaves PyTorch out)
#   PROFILE_ORDER=1: also each run's first profiled step kernel by kernel, in launch order (ncu)
#   exit 0, 1 (a run failed), 2 (bad arguments), 77 (no profiler here)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:-build}"
shift || true
[ -x "$build/bin/ddptrain" ] || { echo "BUILD_DIR $build: no bin/ddptrain there (build first)" >&2; exit 2; }
build="$(cd "$build" && pwd)"
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(medium:tf32 medium:bf16 large:tf32 large:bf16)
tool() { command -v "$1" || ls $2 2>/dev/null | head -1; }
profiler="${PROFILER:-}"
if [ -z "$profiler" ]; then
  [ -n "$(tool ncu "/usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu")" ] && profiler=ncu || profiler=nsys
fi
case "$profiler" in
  ncu) prof="$(tool ncu "/usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu")" ;;
  nsys) prof="$(tool nsys "/usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys")" ;;
  *) echo "PROFILER $profiler: expected ncu or nsys" >&2; exit 2 ;;
esac
[ -n "$prof" ] || { echo "skipped: no $profiler here (Nsight Compute's ncu or Nsight Systems' nsys)"; exit 77; }
py="${PYTHON:-python3}"
torch_mode="${TORCH_MODE-graph}"
if [ -n "$torch_mode" ] && ! "$py" -c 'import torch' 2> /dev/null; then
  echo "PyTorch is not importable by $py (PYTHON): ddptrain alone" >&2
  torch_mode=""
fi
export DDP_CACHE_DIR="${DDP_CACHE_DIR:-$build/ddp-cache}"
reports="${PROFILE_DIR:-$build/profiles}"
mkdir -p "$reports"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
commit="${DDP_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

# profile NAME COMMAND...: COMMAND under the profiler, its capture range's kernels as CSV in
# $tmp/NAME.csv (what step_kernel_summary.py reads).
profile() {
  local name="$1"; shift
  if [ "$profiler" = ncu ]; then
    timeout 500 "$prof" --profile-from-start off --clock-control none --cache-control none \
      --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base \
      --log-file "$tmp/$name.csv" "$@" > "$tmp/$name.log" 2>&1 ||
      { echo "ncu failed ($*):"; tail -5 "$tmp/$name.log" "$tmp/$name.csv"; return 1; }
    cp "$tmp/$name.csv" "$reports/"  # each kernel's time, kept to read
  else
    timeout 400 "$prof" profile --capture-range=cudaProfilerApi --capture-range-end=stop -t cuda \
      --cuda-graph-trace=node --force-overwrite true -o "$reports/$name" "$@" > "$tmp/$name.log" 2>&1 ||
      { echo "nsys profile failed ($*):"; tail -5 "$tmp/$name.log"; return 1; }
    "$prof" stats --report cuda_gpu_kern_sum --format csv --force-export true "$reports/$name.nsys-rep" \
      > "$tmp/$name.csv" 2> "$tmp/$name.err" ||
      { echo "nsys stats failed: $(tail -1 "$tmp/$name.err")"; return 1; }
  fi
}

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
  if [ "$profiler" = ncu ]; then count="${PROFILE_STEPS:-5}"; else count="${PROFILE_STEPS:-$((steps / 6 < 20 ? steps / 6 : 20))}"; fi
  last=$((first + count - 1))
  if ! timeout 300 "$build/bin/ddptrain" "${args[@]}" --metrics "$tmp/plain.jsonl" > "$tmp/plain.log" 2>&1; then
    echo "ddptrain failed on $run:"; tail -5 "$tmp/plain.log"; status=1; continue
  fi
  step_ms="$("$py" -c "import sys; print(1e3 * $batch / float(sys.argv[1]))" "$(ddp_json "$tmp/plain.jsonl" steady_samples_per_s)")"
  profile "$workload-$prec" "$build/bin/ddptrain" "${args[@]}" --profile-steps "$first-$last" || { status=1; continue; }
  beside=()
  if [ -n "$torch_mode" ]; then
    torch=(scripts/torch_mlp.py --device cuda --data random --precision "$prec" --layers "$layers"
           --batch-size "$batch" --warmup 10 --mode "$torch_mode")
    if timeout 600 "$py" "${torch[@]}" --steps "$tsteps" > "$tmp/torch.json" 2> "$tmp/torch.err" &&
      profile "torch-$workload-$prec" "$py" "${torch[@]}" --steps 1 --profile-steps "$count"; then
      beside=(--beside "$tmp/torch-$workload-$prec.csv" --beside-steps "$count"
              --beside-step-ms "$(ddp_json "$tmp/torch.json" ms_per_step)" --beside-name "PyTorch $torch_mode")
    else
      echo "PyTorch --mode $torch_mode failed on $run: $(tail -1 "$tmp/torch.err")"; status=1
    fi
  fi
  limits=()
  if "$py" scripts/torch_matmul_rate.py --layers "$layers" --batch-size "$batch" --precision "$prec" > "$tmp/limits.json" 2> /dev/null; then
    limits=(--limits "$tmp/limits.json")
  fi
  echo "### $workload $prec: steps $first-$last of $steps (batch $batch), $profiler"
  echo
  order=()
  [ "${PROFILE_ORDER:-0}" = 1 ] && order=(--order)
  "$py" scripts/step_kernel_summary.py "$tmp/$workload-$prec.csv" --steps "$count" --step-ms "$step_ms" \
    "${limits[@]}" "${beside[@]}" "${order[@]}" || status=1
  echo
done
echo "(commit $commit; ms a step = the kernels' time in the capture range over its steps; the step's"
echo " wall time from the run without the profiler; limits from scripts/torch_matmul_rate.py in this run)"
exit $status
