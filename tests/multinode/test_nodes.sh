#!/usr/bin/env bash
# Two-node jobs in network namespaces (netns.sh): every node its own address and interface.
#   test_nodes.sh iface      the README's multi-node command with --iface starts and trains
#   test_nodes.sh partition  node 1's link cut mid-run: both nodes exit within --timeout plus
#                            the grace period, each naming the other node by address
# Environment: DDPRUN, DDPTRAIN (the binaries). Exit 0 pass, 1 fail, 77 skipped (no
# namespaces here: not root, or no iproute2).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/netns.sh"
case_name=${1:?usage: test_nodes.sh iface|partition}
mn_available || { echo "skipped: cannot create network namespaces here (needs root and ip)"; exit 77; }
mn_setup 2 || { echo "FAIL: could not set up the namespaces"; exit 1; }
out=$(mktemp -d)
trap 'mn_cleanup; rm -rf "$out"' EXIT
export DDP_STORE_TOKEN=multinode-test-token NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=
port=29611
fail() { echo "FAIL: $*"; for f in "$out"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }

# node K runs ddprun ARGS... in the background, its output in $out/node-K.log
start_node() {
  local k=$1
  shift
  mn_exec "$k" timeout -k 5 60 "$DDPRUN" --nnodes 2 --node-rank "$k" --master-addr "$(mn_addr 0)" \
    --master-port "$port" --iface "e$k" --nproc-per-node 1 "$@" > "$out/node-$k.log" 2>&1 &
  eval "pid_$k=$!"
}

train="--data synthetic --layers 16,32,4 --synthetic-samples 512 --batch-size 32 --threads 1"

case "$case_name" in
  iface)
    start=$(date +%s.%N)
    for k in 0 1; do start_node "$k" -- "$DDPTRAIN" $train --steps 40 --log-every 20 --quiet; done
    wait "$pid_0"; rc0=$?
    wait "$pid_1"; rc1=$?
    took=$(awk -v a="$(date +%s.%N)" -v b="$start" "BEGIN { printf \"%.2f\", a - b }")
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "node exits $rc0 and $rc1 (expected 0 and 0)"
    grep -q "store on $(mn_addr 0):$port (--iface e0" "$out/node-0.log" || fail "node 0 did not serve on its interface's address"
    grep -q "rank 0 of 2 (ddprun), collectives over gloo" "$out/node-0.log" || fail "no two-rank job"
    echo "pass: two nodes with --iface trained in ${took}s"
    ;;
  partition)
    for k in 0 1; do
      start_node "$k" --timeout 5 --grace-period 2 -- "$DDPTRAIN" $train --steps 1000000 --log-every 200 --timeout 5
    done
    for i in $(seq 200); do grep -q "step 200" "$out/node-0.log" 2>/dev/null && break; sleep 0.1; done
    grep -q "step 200" "$out/node-0.log" || fail "the job never trained"
    mn_cut 1
    cut_at=$(date +%s.%N)
    wait "$pid_0"; rc0=$?; end0=$(date +%s.%N)
    wait "$pid_1"; rc1=$?; end1=$(date +%s.%N)
    t0=$(awk -v a="$end0" -v b="$cut_at" "BEGIN { printf \"%.2f\", a - b }")
    t1=$(awk -v a="$end1" -v b="$cut_at" "BEGIN { printf \"%.2f\", a - b }")
    for f in "$out"/*.log; do echo "--- $f"; grep -v "step\|info" "$f"; done
    echo "node 0 exit $rc0 after ${t0}s, node 1 exit $rc1 after ${t1}s"
    [ "$rc0" != 0 ] && [ "$rc1" != 0 ] || fail "both nodes should fail (exits $rc0 and $rc1)"
    # --timeout 5 + --grace-period 2, plus a heartbeat and a margin for a loaded machine.
    awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(a < 12 && b < 12) }' || fail "not within --timeout + grace"
    grep -q "node 1 ($(mn_addr 1)) stopped answering" "$out/node-0.log" ||
      grep -q "rank 0 failed first" "$out/node-0.log" || fail "node 0 did not name node 1 or its failed rank"
    grep -q "lost the rendezvous store at $(mn_addr 0):$port (on node 0)" "$out/node-1.log" ||
      fail "node 1 did not name node 0's store"
    grep -q "wrong token" "$out"/node-*.log && fail "a partition reported as a wrong token"
    echo "pass: a cut link ends both nodes, each naming the other"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
exit 0
