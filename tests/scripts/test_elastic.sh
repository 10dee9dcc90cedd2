#!/usr/bin/env bash
# Elastic membership (ddprun --nnodes 1:3), node processes on this machine over loopback, one
# CPU worker each (Gloo): three nodes start the job; one is killed mid-run (its ddprun and its
# worker, SIGKILL), and the two left go on in a generation of their own from the last
# checkpoint; a fourth node arrives late and the job restarts to take it in; the job ends with
# the weights of one process trained for the same steps (1e-5: the global batch never
# changes). Usage: test_elastic.sh DDPRUN DDPTRAIN. Exit 77 without Gloo.
set -uo pipefail
ddprun="$1"
ddptrain="$2"
here="$(cd "$(dirname "$0")" && pwd)"
"$ddptrain" --version | grep -q "gloo yes" || { echo "skipped: built without Gloo"; exit 77; }
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 -- "-$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
export CUDA_VISIBLE_DEVICES= DDP_STORE_TOKEN=elastic-test-token
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
train=("$ddptrain" --data synthetic --layers 12,32,16,4 --synthetic-samples 240 --batch-size 24
       --steps 120 --log-every 10 --seed 3 --threads 1 --lr-schedule constant --quiet)
node=("$ddprun" --nnodes 1:3 --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$port"
      --rdzv-conf last_call_timeout=2 --max-restarts 3 --timeout 20 --grace-period 2 --)
elastic=("${train[@]}" --checkpoint-dir "$work/ckpt" --checkpoint-every 5 --resume
         --step-delay-ms 40 --save-weights "$work/elastic.st")
# Each node in a session of its own, so that killing one kills its ddprun and its worker.
start() { setsid "${node[@]}" "${elastic[@]}" > "$work/$1.log" 2>&1 & pids+=($!); eval "$1=$!"; }
wait_for() {  # "FILE..." PATTERN SECONDS: the pattern in any of the files
  local files
  read -r -a files <<<"$1"
  for _ in $(seq $((10 * $3))); do grep -q "$2" "${files[@]}" 2>/dev/null && return 0; sleep 0.1; done
  echo "FAILED: no '$2' in $1 within $3 s"; tail -n 30 "${files[@]}"; return 1
}
failed=0
start a
sleep 0.3
start b
start c
wait_for "$work/a.log" "generation 0: node 0 of 3" 30 || exit 1
wait_for "$work/a.log" "checkpoint at step 20 " 60 || exit 1
kill -9 -- "-$c"  # node c dies: its ddprun and its worker
# The nodes left name it as lost (not their own ranks' failure) and spend no restart.
wait_for "$work/a.log $work/b.log" "node [0-9] (127.0.0.1) is lost (its heartbeat stopped" 60 || exit 1
wait_for "$work/a.log $work/b.log" "1 node lost so far; no restart spent" 60 || exit 1
# (A survivor later than the last call comes in at the next generation: any generation.)
wait_for "$work/a.log" "generation [1-9][0-9]*: node . of 2" 60 || exit 1
wait_for "$work/a.log $work/b.log" "resumed from" 60 || exit 1  # rank 0's, on a or b
start d  # late: the running generation makes room for it
wait_for "$work/a.log" "waiting to join: restarting the group with it" 60 || exit 1
wait_for "$work/a.log" "generation [1-9][0-9]*: node . of 3" 60 || exit 1
for n in a b d; do
  eval "pid=\$$n"
  wait "$pid"
  code=$?
  [ $code -eq 0 ] || { echo "FAILED: node $n exited $code"; cat "$work/$n.log"; failed=1; }
done
grep -h "ddprun: generation" "$work/a.log"
# One process, the same steps, no interruption.
"${train[@]}" --save-weights "$work/one.st" > "$work/one.log" 2>&1 ||
  { cat "$work/one.log"; echo "FAILED: the one-process run"; exit 1; }
python3 "$here/../multinode/compare_weights.py" "$work/elastic.st" "$work/one.st" 1e-5 ||
  { echo "FAILED: the elastic job's weights against one process"; failed=1; }
[ $failed -eq 0 ] && echo "elastic: survived a lost node and took in a late one; weights equal one process"
exit $failed
