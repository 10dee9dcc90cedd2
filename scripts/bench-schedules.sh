#!/usr/bin/env bash
# Pipeline schedules, same run: pp 2 over two processes, 8 micro-batches; for each schedule the
# measured bubble against the simulator's prediction from that run's measured costs (free
# transfers) and the schedule's ideal (equal stages, F = B = W), the step time against the
# simulator's step from the same costs, and its ratio to 1F1B's. The schedules run interleaved,
# ROUNDS times, and the medians are printed as a Markdown table.
#   CPU (the default): one OpenBLAS thread a process, a model whose layers take milliseconds
#   (eight 1024-wide layers).
#   DEVICE=cuda: the workload `large` of shared/BENCHMARKS.md (global batch 4096) on two GPUs, a
#   stage each (PRECISION: tf32, or bf16); SHARE=1 puts both ranks on one GPU (ddprun
#   --share-gpu, NCCL over sockets) on a smaller model (eight 1024-wide layers, batch 1024) to
#   check that the script and the records work, never for the figures.
# Usage: [DEVICE=cuda [PRECISION=tf32] [SHARE=1]] scripts/bench-schedules.sh [BUILD_DIR] [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
build="${1:-build}"
rounds="${2:-3}"
py="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
device="${DEVICE:-cpu}"
launch=(--nproc-per-node 2)
shared=""
if [ "$device" = cuda ]; then
  source scripts/workloads.sh
  ddp_workload large
  if [ "${SHARE:-0}" = 1 ]; then
    # The check of the script alone: a smaller model, as NCCL's sockets carry large's activations
    # too slowly for one device call.
    launch+=(--share-gpu)
    shared=", ranks sharing one GPU: not a speed figure"
    layers=1024,1024,1024,1024,1024,1024,1024,1024,10 batch=1024 samples=4096
  fi
  common=(--device cuda --precision "${PRECISION:-tf32}" --data synthetic --layers "$layers"
          --synthetic-samples "$samples" --batch-size "$batch" --micro-batches 8 --steps 20
          --log-every 5 --quiet --pp 2)
  visible=()
else
  layers=784,1024,1024,1024,1024,1024,1024,1024,10
  common=(--data synthetic --layers "$layers" --synthetic-samples 4096 --batch-size 256
          --micro-batches 8 --steps 40 --log-every 10 --threads 1 --quiet --pp 2)
  visible=(CUDA_VISIBLE_DEVICES=)
fi
schedules=(gpipe 1f1b zb-h1 interleaved-1f1b zb-v)
failed=0
for round in $(seq "$rounds"); do
  for schedule in "${schedules[@]}"; do
    if ! env "${visible[@]}" timeout 600 "$build/bin/ddprun" "${launch[@]}" -- \
      "$build/bin/ddptrain" "${common[@]}" --schedule "$schedule" \
      --metrics "$tmp/$schedule.$round.jsonl" > "$tmp/$schedule.$round.log" 2>&1; then
      echo "bench-schedules: $schedule failed (round $round):" >&2
      tail -5 "$tmp/$schedule.$round.log" >&2
      failed=1
    fi
  done
done
"$py" - "$tmp" "$rounds" "${schedules[@]}" <<'PY' || failed=1
import json, statistics, sys
tmp, rounds, schedules = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def windows(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        if r.get("event") == "pipeline":
            out.append(r)
    return out[1:]  # the first window holds the start-up
rows = {}
for s in schedules:
    bubble, sim, step, sim_step = [], [], [], []
    ideal = None
    for k in range(1, rounds + 1):
        try:
            w = windows(f"{tmp}/{s}.{k}.jsonl")
        except FileNotFoundError:
            continue
        for r in w:
            bubble.append(r["bubble"])
            sim.append(r.get("simulated_bubble", float("nan")))
            step.append(r["step_s"])
            sim_step.append(r.get("simulated_step_s", float("nan")))
            ideal = r["ideal_bubble"]
    if step:
        rows[s] = (statistics.median(bubble), statistics.median(sim), ideal,
                   statistics.median(step), statistics.median(sim_step))
base = rows.get("1f1b", (0, 0, 0, float("nan"), 0))[3]
print("| schedule | measured bubble | simulated from measured costs | ideal (equal stages) | step ms | simulated step ms | step / simulated | vs 1f1b |")
print("|---|---|---|---|---|---|---|---|")
for s, (b, sim, ideal, step, sim_step) in rows.items():
    print(f"| {s} | {100*b:.1f} % | {100*sim:.1f} % | {100*ideal:.1f} % | {1e3*step:.1f} | "
          f"{1e3*sim_step:.1f} | {step/sim_step:.3f} | {step/base:.2f}x |")
if len(rows) != len(schedules):
    sys.exit(1)
PY
echo "(commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $device, pp 2, 8 micro-batches, --layers $layers$shared; medians over $rounds rounds of the windows after the first)"
exit $failed
