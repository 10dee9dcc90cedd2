#!/usr/bin/env bash
# scripts/plot_timeline.py on a real --timeline of a 2-stage pipeline (ddprun, Gloo): a PNG
# with both ranks; a step range that was not recorded and a file that is not a trace are
# refused. And on a GPU-shaped trace (a communication track beside the rank's), with
# scripts/timeline_stats.py's figures for it, and for a GPU pipeline stage's trace. Exit 77 (skipped) without matplotlib or Gloo.
# Usage: test_plot_timeline.sh DDPRUN DDPTRAIN
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
ddprun="$1"
ddptrain="$2"
source "$root/scripts/deps.sh"
py="$(ddp_python_with matplotlib)"
if [ -z "$py" ]; then
  echo "skipped: no Python with matplotlib (Debian: python3-matplotlib)"
  exit 77
fi
case "$("$ddptrain" --version)" in *"gloo yes"*) ;; *) echo "skipped: built without Gloo"; exit 77 ;; esac
source "$(dirname "$0")/check_lib.sh"
CUDA_VISIBLE_DEVICES= "$ddprun" --nproc-per-node 2 -- "$ddptrain" --data synthetic \
  --layers 8,64,64,4 --steps 6 --pp 2 --micro-batches 4 --quiet --timeline "$work/t.json" \
  > "$work/run.log" 2>&1 || { cat "$work/run.log"; echo "ddptrain failed"; exit 1; }
out="$("$py" "$root/scripts/plot_timeline.py" "$work/t.json" -o "$work/t.png")"
echo "$out"
check grep -q "ranks: 2; steps 5-6" <<<"$out"
check test "$(head -c 8 "$work/t.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a"
check test "$(stat -c %s "$work/t.png")" -gt 10000
check bash -c "! '$py' '$root/scripts/plot_timeline.py' '$work/t.json' --steps 40-41 -o '$work/x.png' 2>/dev/null"
echo '{"traceEvents": []}' > "$work/empty.json"
check bash -c "! '$py' '$root/scripts/plot_timeline.py' '$work/empty.json' -o '$work/x.png' 2>/dev/null"
# Two steps of one GPU rank: forward 1 ms, two layers' backward 1 ms each, bucket 0 reduced
# during the second layer, bucket 1 for 0.5 ms after backward, the optimizer to 4 ms.
"$py" - "$work/gpu.json" <<'PY'
import json, sys
events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "rank 0 GPU"}},
          {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "rank 0 GPU communication"}},
          {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}},
          {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": 1, "args": {"sort_index": 1}}]
for step in (1, 2):
    t = 10000 * step
    for cat, index, tid, a, b in [("forward", -1, 0, 0, 1000), ("backward layer", 1, 0, 1000, 2000),
                                  ("backward layer", 0, 0, 2000, 3000), ("all-reduce bucket", 0, 1, 2000, 2800),
                                  ("all-reduce bucket", 1, 1, 3000, 3500), ("optimizer", -1, 0, 3000, 4000)]:
        events.append({"ph": "X", "name": cat, "cat": cat, "pid": 0, "tid": tid, "ts": t + a, "dur": b - a,
                       "args": {"step": step, "micro_batch": index}})
json.dump({"traceEvents": events}, open(sys.argv[1], "w"))
PY
out="$("$py" "$root/scripts/plot_timeline.py" "$work/gpu.json" -o "$work/gpu.png" --steps 1-2)"
echo "$out"
check grep -q "ranks: 2; steps 1-2" <<<"$out"
stats="$("$py" "$root/scripts/timeline_stats.py" "$work/gpu.json" --skip 0)"
echo "$stats"
check grep -qF "| rank 0 GPU | 2 | 4.000 | 1.000 | 2.000 | 1.000 | 1.300 | 0.500 |" <<<"$stats"
# A GPU pipeline stage's trace: two micro-batches' forwards and backwards, no optimizer span;
# a step runs to the next step's first span (steps 1 and 2 counted, 3 only ends step 2).
"$py" - "$work/pp.json" <<'PY'
import json, sys
events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "rank 0 (stage 0, replica 0)"}}]
for step in (1, 2, 3):
    t = 10000 * step
    for cat, mb, a, b in [("forward", 0, 0, 500), ("forward", 1, 500, 1000),
                          ("backward", 0, 2000, 3000), ("backward", 1, 3500, 4500)]:
        events.append({"ph": "X", "name": f"{cat} {mb}", "cat": cat, "pid": 0, "tid": 0, "ts": t + a,
                       "dur": b - a, "args": {"step": step, "micro_batch": mb}})
json.dump({"traceEvents": events}, open(sys.argv[1], "w"))
PY
stats="$("$py" "$root/scripts/timeline_stats.py" "$work/pp.json" --skip 0)"
echo "$stats"
check grep -qF "| rank 0 (stage 0, replica 0) | 2 | 10.000 | 1.000 | 2.000 | 5.500 | 0.000 | 0.000 |" <<<"$stats"
[ $failed -eq 0 ] && echo "plot_timeline: ok"
exit $failed
