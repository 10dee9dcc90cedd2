#!/usr/bin/env bash
# scripts/plot_timeline.py on a real --timeline of a 2-stage pipeline (ddprun, Gloo): a PNG
# with both ranks; a step range that was not recorded and a file that is not a trace are
# refused. Exit 77 (skipped) without matplotlib or Gloo.
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
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0
check() { if ! "$@"; then echo "FAILED: $*"; failed=1; fi; }
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
[ $failed -eq 0 ] && echo "plot_timeline: ok"
exit $failed
