#!/usr/bin/env bash
# Pipeline parallelism on two GPUs: the workload `large` of shared/BENCHMARKS.md (global
# batch 4096) split into two stages, one per GPU (ddprun, NCCL).
#  1. pp 2 with both schedules against one GPU: weights after 4 steps, fp32 (max |a-b|/max|b|).
#  2. Step time with 4, 8 and 16 micro-batches, both schedules, tf32 and bf16, against the
#     ideal: the slower stage's measured compute of a step (its forwards and backwards, timed
#     by CUDA events) x (M + P - 1) / M; and throughput against one GPU.
#  3. A --timeline of each schedule at M = 8, tf32 (draw it with scripts/plot_timeline.py).
# Prints Markdown tables; keeps the traces in OUTDIR.
# Usage: scripts/bench-pipeline.sh BUILD_DIR OUTDIR [part...]   (parts: equal time timeline)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
source scripts/workloads.sh
build="${1:-build}"
outdir="${2:-$(mktemp -d)}"
shift 2 || true
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(equal time timeline)
want() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
mkdir -p "$outdir"
py="${PYTHON:-python3}"
tmp="$(mktemp -d)"
ddp_workload large
steps="${PP_STEPS:-24}"
common=(--device cuda --data synthetic --layers "$layers" --batch-size "$batch"
        --synthetic-samples $((batch * 2)) --lr-schedule constant --lr 0.01 --quiet)
# PP_FLAGS: more flags for the pipelined runs (e.g. --overlap-optimizer).
pp() { timeout 300 "$build/bin/ddprun" --nproc-per-node 2 -- "$build/bin/ddptrain" "${common[@]}" --pp 2 ${PP_FLAGS:-} "$@"; }
one() { timeout 300 "$build/bin/ddptrain" "${common[@]}" "$@"; }
failed=0

if want equal; then
  echo "| run (fp32, 4 steps) | max relative error against one GPU |"
  echo "|---|---|"
  if one --precision fp32 --steps 4 --log-every 4 --save-weights "$tmp/one.st" > "$tmp/one.log" 2>&1; then
    for schedule in gpipe 1f1b; do
      if pp --precision fp32 --steps 4 --log-every 4 --schedule "$schedule" --micro-batches 8 \
        --save-weights "$tmp/pp.st" > "$tmp/pp.log" 2>&1; then
        "$py" - "$tmp/pp.st" "$tmp/one.st" "$schedule" <<'PY' || failed=1
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32)
            for k, v in header.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), "the tensors differ"
diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
scale = max(float(np.max(np.abs(b[k]))) for k in b)
error = diff / scale
print(f"| pp 2, {sys.argv[3]}, 8 micro-batches | {error:.3g} ({'within' if error <= 1e-5 else 'BEYOND'} 1e-5) |")
sys.exit(0 if error <= 1e-5 else 1)
PY
      else
        echo "| pp 2 $schedule | FAILED: $(tail -1 "$tmp/pp.log") |"; failed=1
      fi
    done
  else
    echo "| one GPU | FAILED: $(tail -1 "$tmp/one.log") |"; failed=1
  fi
fi

if want time; then
  echo
  echo "| precision | schedule | M | step ms | ideal ms | over ideal | bubble measured / ideal | samples/s | vs one GPU |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for prec in tf32 bf16; do
    one --precision "$prec" --steps "$steps" --log-every $((steps / 3)) --metrics "$tmp/one.jsonl" \
      > "$tmp/one.log" 2>&1 || { echo "one GPU $prec failed: $(tail -1 "$tmp/one.log")"; failed=1; continue; }
    single="$(ddp_json "$tmp/one.jsonl" steady_samples_per_s)"
    for schedule in gpipe 1f1b; do
      for m in ${PP_MICRO:-4 8 16}; do
        pp --precision "$prec" --schedule "$schedule" --micro-batches "$m" --steps "$steps" \
          --log-every $((steps / 3)) --metrics "$tmp/pp.jsonl" > "$tmp/pp.log" 2>&1 ||
          { echo "| $prec | $schedule | $m | FAILED: $(tail -1 "$tmp/pp.log") |"; failed=1; continue; }
        "$py" - "$tmp/pp.jsonl" "$prec" "$schedule" "$m" "$single" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pipe = [r for r in records if r.get("event") == "pipeline"][-1]  # the last window: steady
rate = [r for r in records if "steady_samples_per_s" in r][-1]["steady_samples_per_s"]
m, p, single = int(sys.argv[4]), pipe["stages"], float(sys.argv[5])
step = pipe["step_s"]
compute = max(pipe["busy_s"]) / pipe["steps"]  # the slower stage's forwards and backwards
ideal = compute * (m + p - 1) / m
print(f"| {sys.argv[2]} | {sys.argv[3]} | {m} | {1e3*step:.2f} | {1e3*ideal:.2f} | "
      f"{100*(step/ideal-1):+.1f} % | {100*pipe['bubble']:.1f} % / {100*pipe['ideal_bubble']:.1f} % | "
      f"{rate/1e3:.1f} k | {rate/single:.2f}x ({single/1e3:.1f} k) |")
PY
      done
    done
  done
fi

if want timeline; then
  for schedule in gpipe 1f1b; do
    pp --precision tf32 --schedule "$schedule" --micro-batches 8 --steps 6 --log-every 3 \
      --timeline "$outdir/pipeline-$schedule.json" > "$tmp/tl.log" 2>&1 ||
      { echo "timeline $schedule failed: $(tail -1 "$tmp/tl.log")"; failed=1; continue; }
    echo "timeline of pp 2 $schedule M=8 tf32: $outdir/pipeline-$schedule.json"
  done
fi
echo "(commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(nvidia-smi -L | head -2 | cut -d'(' -f1 | tr '\n' ';'))"
rm -rf "$tmp"
exit $failed
