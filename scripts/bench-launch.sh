#!/usr/bin/env bash
# Launch to exit of a small PyTorch DDP script (Gloo, 2 workers on the CPU): ddprun (serving
# PyTorch's store, and with --no-torch-store) against torchrun with its defaults and with --monitor-interval 0.1,
# interleaved, ROUNDS
# times each; prints a Markdown table of the medians, the spread (max - min) and the ratios.
# Needs a python3 with torch (Debian: python3-torch) and torchrun on PATH.
# Usage: scripts/bench-launch.sh [BUILD_DIR] [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
rounds="${2:-5}"
py="${PYTHON:-/usr/bin/python3}"
torchrun="${TORCHRUN:-$(command -v torchrun)}"
[ -n "$torchrun" ] || { echo "bench-launch: no torchrun on PATH" >&2; exit 1; }
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "bench-launch: $py has no torch" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/ddp_step.py" <<'PY'
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(20, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(10):
    opt.zero_grad()
    model(torch.rand(32, 20)).sum().backward()
    opt.step()
dist.destroy_process_group()
PY
export OMP_NUM_THREADS=1  # both launchers alike
# Debian's torchrun 1.13 needs -r 1 -t 1 on Python 3.11 (its default log redirection crashes)
# and knows only the underscore spellings.
declare -A cmds=(
  [ddprun]="$build/bin/ddprun --standalone --nproc_per_node=2 -- $py $tmp/ddp_step.py"
  [ddprun-no-torch-store]="$build/bin/ddprun --no-torch-store --standalone --nproc_per_node=2 -- $py $tmp/ddp_step.py"
  [torchrun]="$torchrun --standalone --nproc_per_node=2 -r 1 -t 1 $tmp/ddp_step.py"
  [torchrun-monitor-0.1]="$torchrun --standalone --nproc_per_node=2 -r 1 -t 1 --monitor_interval 0.1 $tmp/ddp_step.py"
)
names=(ddprun ddprun-no-torch-store torchrun torchrun-monitor-0.1)
failed=0
for round in $(seq "$rounds"); do
  for name in "${names[@]}"; do
    start=$(date +%s.%N)
    if ! PATH="$(dirname "$py"):$PATH" ${cmds[$name]} > "$tmp/$name.$round.log" 2>&1; then
      echo "bench-launch: $name failed (round $round):" >&2
      tail -5 "$tmp/$name.$round.log" >&2
      failed=1
    fi
    end=$(date +%s.%N)
    echo "$name $(echo "$end - $start" | bc)" >> "$tmp/times"
  done
done
"$py" - "$tmp/times" <<'PY' || failed=1
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    name, t = line.split()
    times.setdefault(name, []).append(float(t))
med = {k: statistics.median(v) for k, v in times.items()}
print("| launcher | median s | min s | max s | spread s | ddprun / this |")
print("|---|---|---|---|---|---|")
for k, v in times.items():
    print(f"| {k} | {med[k]:.2f} | {min(v):.2f} | {max(v):.2f} | {max(v) - min(v):.2f} | "
          f"{med['ddprun'] / med[k]:.2f}x |")
PY
exit $failed
