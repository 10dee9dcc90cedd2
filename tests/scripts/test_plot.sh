#!/usr/bin/env bash
# scripts/plot_metrics.py on real metrics: two ddptrain runs that differ in --lr drawn into
# one PNG whose legend names the difference; one run alone; run through its #! line with
# DDP_PYTHON, and the line an interpreter without matplotlib gets. Exit 77 (skipped) without
# matplotlib. Usage: test_plot.sh DDPTRAIN
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
ddptrain="$1"
source "$root/scripts/deps.sh"
py="$(ddp_python_with matplotlib)"
if [ -z "$py" ]; then
  echo "skipped: no Python with matplotlib (Debian: python3-matplotlib)"
  exit 77
fi
source "$(dirname "$0")/check_lib.sh"
for lr in 0.05 0.1; do
  "$ddptrain" --data synthetic --layers 8,16,4 --steps 40 --log-every 5 --eval-every 10 --quiet \
    --lr "$lr" --metrics "$work/lr-$lr.jsonl" > /dev/null || { echo "ddptrain failed"; exit 1; }
done
out="$("$py" "$root/scripts/plot_metrics.py" "$work/lr-0.05.jsonl" "$work/lr-0.1.jsonl" -o "$work/two.png")"
echo "$out"
check grep -q "run: lr=0.05" <<<"$out"
check grep -q "run: lr=0.1" <<<"$out"
check test "$(head -c 8 "$work/two.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a"
check test "$(stat -c %s "$work/two.png")" -gt 20000
# Run as a user runs it (its #! line: the first python3 on PATH, which may lack matplotlib):
# it goes on under DDP_PYTHON where that one has it; an interpreter without it and no other is
# one line naming both and the ways to get it.
check env DDP_PYTHON="$py" "$root/scripts/plot_metrics.py" "$work/lr-0.05.jsonl" -o "$work/direct.png"
check test -s "$work/direct.png"
if err="$(DDP_PYTHON=/nonexistent "$py" -S "$root/scripts/plot_metrics.py" "$work/lr-0.05.jsonl" \
            -o "$work/none.png" 2>&1)"; then
  echo "(matplotlib importable without site-packages: the error line is not checked)"
else
  check grep -q "has no matplotlib (nor has DDP_PYTHON /nonexistent); install python3-matplotlib" <<<"$err"
fi
out="$("$py" "$root/scripts/plot_metrics.py" "$work/lr-0.05.jsonl" -o "$work/one.png")"
check grep -q "run: lr-0.05.jsonl" <<<"$out"
check test -s "$work/one.png"
# GPU monitor fields (a --device cuda run's records, two ranks, one without NVML): two more
# panels, so the figure is taller.
{
  echo '{"event": "start", "config": {"device": "cuda"}}'
  for step in 100 200 300; do
    echo '{"event": "step", "step": '$step', "loss": 0.5, "accuracy": 0.8, "lr": 0.05,' \
      '"samples_per_s": 1e6, "gpu": {"util": {"mean": [95, null], "max": [99, null]},' \
      '"mem_used_mib": {"mean": [2048, null], "max": [3072, null]}}}'
  done
} > "$work/gpu.jsonl"
check "$py" "$root/scripts/plot_metrics.py" "$work/gpu.jsonl" -o "$work/gpu.png"
height() { "$py" -c 'import struct, sys; print(struct.unpack(">I", open(sys.argv[1], "rb").read()[20:24])[0])' "$1"; }
check test "$(height "$work/gpu.png")" -gt "$(height "$work/one.png")"
: > "$work/empty.jsonl"
check bash -c "! '$py' '$root/scripts/plot_metrics.py' '$work/empty.jsonl' -o '$work/x.png' 2>/dev/null"
[ $failed -eq 0 ] && echo "plot: ok"
exit $failed
