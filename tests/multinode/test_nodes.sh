#!/usr/bin/env bash
# Multi-node jobs in network namespaces (netns.sh): every node its own address and interface.
#   test_nodes.sh iface      the README's multi-node command with --iface starts and trains
#   test_nodes.sh three      3 nodes x 2 workers (dp 6) train to one process's weights (1e-5)
#   test_nodes.sh pp         dp 2 x pp 2 on 2 nodes x 2 workers, the stages on different
#                            nodes: one process's weights (1e-5)
#   test_nodes.sh slow       the link to node 1 shaped to 4 Mbit/s (tc tbf): 2 nodes x 2
#                            workers still train to one process's weights (1e-5)
#   test_nodes.sh delay      node 1 reaches the store through a proxy that holds every
#                            segment back 200 ms each way (delay_proxy.py): the job still
#                            trains to one process's weights (1e-5)
#   test_nodes.sh mpirun     mpirun with a hostfile of the nodes' addresses and an rsh agent
#                            that enters the node's namespace (no ssh): 2 nodes x 2 ranks
#                            over MPI give one process's weights (1e-5)
#   test_nodes.sh partition  node 1's link cut mid-run: both nodes exit within --timeout plus
#                            the grace period, each naming the other node by address
#   test_nodes.sh cut        the same with ddprun's default --timeout (300 s) and the
#                            workers' --timeout 5: both nodes exit within the workers'
#                            deadline, the store diagnosis (3 s), the silence a failed node
#                            waits out (5 s) and the grace period, each naming the other node
#   test_nodes.sh killed     node 1's ddprun killed (SIGKILL) mid-run: node 0 ends within
#                            --timeout plus grace naming node 1, nothing left in any namespace
#   test_nodes.sh refused    a node with the wrong token, one with the wrong --nnodes, and a
#                            second --node-rank 0 on another host are
#                            refused (exit 2) with a line that names what differs
# Environment: DDPRUN, DDPTRAIN (the binaries). Exit 0 pass, 1 fail, 77 skipped (no
# namespaces here: not root, or no iproute2).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/netns.sh"
case_name=${1:?usage: test_nodes.sh iface|three|pp|slow|delay|mpirun|partition|cut|killed|refused}
mn_available || { echo "skipped: cannot create network namespaces here (needs root and ip)"; exit 77; }
nodes=2
[ "$case_name" = three ] && nodes=3
mn_setup "$nodes" || { echo "FAIL: could not set up the namespaces"; exit 1; }
out=$(mktemp -d)
trap 'mn_cleanup; rm -rf "$out"' EXIT
export DDP_STORE_TOKEN=multinode-test-token NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=
port=29611
fail() { echo "FAIL: $*"; for f in "$out"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }

# node K runs ddprun ARGS... in the background, its output in $out/node-K.log; NPROC workers
# (default 1), NNODES nodes (default: those set up).
start_node() {
  local k=$1
  shift
  mn_exec "$k" timeout -k 5 60 "$DDPRUN" --nnodes "${NNODES:-$nodes}" --node-rank "$k" \
    --master-addr "$(mn_addr 0)" --master-port "$port" --iface "e$k" \
    --nproc-per-node "${NPROC:-1}" "$@" > "$out/node-$k.log" 2>&1 &
  eval "pid_$k=$!"
}
# Both nodes train for good (--timeout 5 for ddprun and the workers, grace 2), until node 0
# has logged step 200. With WRAP_1, node 1's worker runs behind `sh -c 'WRAP_1'` (a wrapper
# that leaves a child of its own).
# LAUNCHER_TIMEOUT: ddprun's --timeout (default 5; "" for ddprun's own default).
start_long_job() {
  local k i
  local launcher_timeout=(--timeout "${LAUNCHER_TIMEOUT-5}")
  [ -z "${LAUNCHER_TIMEOUT-5}" ] && launcher_timeout=()
  for k in 0 1; do
    local wrap=()
    [ "$k" = 1 ] && [ -n "${WRAP_1:-}" ] && wrap=(sh -c "$WRAP_1" sh)
    start_node "$k" "${launcher_timeout[@]}" --grace-period 2 -- "${wrap[@]}" "$DDPTRAIN" $train \
      --steps 1000000 --log-every 200 --timeout 5
  done
  for i in $(seq 200); do grep -q "step 200" "$out/node-0.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "step 200" "$out/node-0.log" || fail "the job never trained"
}
# Cuts node 1's link, waits for both nodes and prints how long each took after the cut
# ($t0, $t1); fails unless both exited non-zero.
cut_node_1() {
  mn_cut 1
  local cut_at end0 end1
  cut_at=$(date +%s.%N)
  wait "$pid_0"; rc0=$?; end0=$(date +%s.%N)
  wait "$pid_1"; rc1=$?; end1=$(date +%s.%N)
  t0=$(awk -v a="$end0" -v b="$cut_at" "BEGIN { printf \"%.2f\", a - b }")
  t1=$(awk -v a="$end1" -v b="$cut_at" "BEGIN { printf \"%.2f\", a - b }")
  for f in "$out"/*.log; do echo "--- $f"; grep -v "step\|info" "$f"; done
  echo "node 0 exit $rc0 after ${t0}s, node 1 exit $rc1 after ${t1}s"
  [ "$rc0" != 0 ] && [ "$rc1" != 0 ] || fail "both nodes should fail (exits $rc0 and $rc1)"
}
# Nothing of the job may be left in any node's namespace.
nothing_left() {
  local k
  for ((k = 0; k < nodes; k++)); do
    [ -z "$(ip netns pids "$MN_TAG-$k" 2>/dev/null)" ] || fail "processes left in node $k"
  done
}
# The job's weights against one process's (same flags, alone).
equals_one_process() {
  "$DDPTRAIN" "$@" --save-weights "$out/one.st" > "$out/one.log" 2>&1 || fail "one process failed"
  python3 "$here/compare_weights.py" "$out/w.st" "$out/one.st" 1e-5 || fail "weights differ from one process"
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
  three | pp | slow)
    args=($train --steps 24 --log-every 12 --batch-size 48 --seed 7 --quiet)
    split=()  # how the job splits the work (one process takes the whole batch)
    [ "$case_name" = pp ] && { args+=(--layers 16,32,24,4); split=(--pp 2 --micro-batches 4); }
    if [ "$case_name" = slow ]; then
      command -v tc >/dev/null 2>&1 || { echo "skipped: no tc here"; exit 77; }
      args+=(--layers 16,128,128,4)  # 78 KB of gradients a step: the link is what it waits on
      mn_slow 1 4mbit || fail "could not shape node 1's link"
      start=$(date +%s.%N)
    fi
    # Every rank gets the same flags (rank 0 alone writes the file).
    for ((k = 0; k < nodes; k++)); do
      NPROC=2 start_node "$k" -- "$DDPTRAIN" "${args[@]}" "${split[@]}" --save-weights "$out/w.st"
    done
    for ((k = 0; k < nodes; k++)); do
      eval "wait \$pid_$k" || fail "node $k failed"
    done
    [ "$case_name" = pp ] && { grep -q "stage 0: .* on ranks 0,1; stage 1: .* on ranks 2,3" "$out/node-0.log" ||
      fail "the stages are not on different nodes"; }
    equals_one_process "${args[@]}"
    nothing_left
    [ "$case_name" = slow ] &&
      echo "the job took $(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { printf "%.2f", a - b }')s over a 4 Mbit/s link"
    echo "pass: $case_name on $nodes nodes x 2 workers equals one process"
    ;;
  delay)
    # The proxy listens on node 1's own address; node 1's ddprun and workers take it for
    # node 0's (--master-addr), so every store message crosses it (Gloo's own connections go
    # straight to the peers).
    mn_exec 1 python3 "$here/delay_proxy.py" "$(mn_addr 1)" "$port" "$(mn_addr 0)" "$port" 0.2 \
      > "$out/proxy.log" 2>&1 &
    proxy=$!
    for i in $(seq 50); do grep -q listening "$out/proxy.log" && break; sleep 0.1; done
    args=($train --steps 24 --log-every 12 --batch-size 48 --seed 7 --quiet)
    start=$(date +%s.%N)
    start_node 0 -- "$DDPTRAIN" "${args[@]}" --save-weights "$out/w.st"
    mn_exec 1 timeout -k 5 90 "$DDPRUN" --nnodes 2 --node-rank 1 --master-addr "$(mn_addr 1)" \
      --master-port "$port" --iface e1 --nproc-per-node 1 -- "$DDPTRAIN" "${args[@]}" \
      --save-weights "$out/w.st" > "$out/node-1.log" 2>&1 &
    pid_1=$!
    wait "$pid_0" || fail "node 0 failed"
    wait "$pid_1" || fail "node 1 failed"
    # The job is over: what is left in node 1 is the proxy.
    ip netns pids "$MN_TAG-1" | xargs -r kill 2>/dev/null
    wait "$proxy" 2>/dev/null
    echo "the job took $(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN { printf "%.2f", a - b }')s with 200 ms each way to the store"
    grep -q "store on $(mn_addr 1):$port" "$out/node-1.log" || fail "node 1 did not use the proxy"
    equals_one_process "${args[@]}"
    nothing_left
    echo "pass: a store 200 ms away still trains to one process's weights"
    ;;
  mpirun)
    command -v mpirun >/dev/null 2>&1 || { echo "skipped: no mpirun here"; exit 77; }
    "$DDPTRAIN" --version | grep -q "mpi yes" || { echo "skipped: built without MPI"; exit 77; }
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Open MPI's rsh agent gets "HOST COMMAND...": the command runs in HOST's namespace.
    cat > "$out/agent.sh" <<AGENT
#!/bin/sh
host=\$1
shift
exec ip netns exec $MN_TAG-\$((\${host##*.} - 1)) sh -c "\$*"
AGENT
    chmod +x "$out/agent.sh"
    printf '%s slots=2\n%s slots=2\n' "$(mn_addr 0)" "$(mn_addr 1)" > "$out/hosts"
    # TCP only: the ranks of both "hosts" share a host name and /dev/shm, which would make
    # Open MPI's shared-memory transport span the namespaces.
    mpi=(timeout -k 5 60 mpirun -np 4 --hostfile "$out/hosts" --mca plm_rsh_agent "$out/agent.sh"
         --mca plm_rsh_no_tree_spawn 1 --mca btl self,tcp --mca btl_tcp_if_include 10.77.0.0/24
         --mca oob_tcp_if_include 10.77.0.0/24)
    where=$(mn_exec 0 "${mpi[@]}" sh -c 'ip -o -4 addr show scope global | awk "{print \$4}"' 2>&1)
    [ "$(grep -c "^$(mn_addr 0)/24$" <<<"$where")" = 2 ] && [ "$(grep -c "^$(mn_addr 1)/24$" <<<"$where")" = 2 ] ||
      fail "the ranks did not run two on each node: $where"
    args=($train --steps 24 --log-every 12 --batch-size 48 --seed 7 --quiet)
    mn_exec 0 "${mpi[@]}" "$DDPTRAIN" --backend mpi "${args[@]}" --save-weights "$out/w.st" \
      > "$out/node-0.log" 2>&1 || fail "mpirun failed"
    grep -q "rank 0 of 4 (mpirun), collectives over mpi" "$out/node-0.log" || fail "not over MPI"
    equals_one_process "${args[@]}"
    nothing_left
    echo "pass: mpirun over 2 nodes x 2 ranks equals one process"
    ;;
  killed)
    # Node 1's worker leaves a child that would sleep on: the guard between ddprun and each
    # worker must take the whole group down when ddprun dies.
    WRAP_1='sleep 600 & exec "$@"' start_long_job
    ddprun_1=$(ip netns pids "$MN_TAG-1" | while read -r p; do
      [ "$(cat /proc/$p/comm 2>/dev/null)" = ddprun ] && echo "$p"; done | head -1)
    [ -n "$ddprun_1" ] || fail "no ddprun in node 1"
    kill -9 "$ddprun_1"
    killed_at=$(date +%s.%N)
    wait "$pid_0"; rc0=$?
    t0=$(awk -v a="$(date +%s.%N)" -v b="$killed_at" "BEGIN { printf \"%.2f\", a - b }")
    echo "node 0 exit $rc0 ${t0}s after node 1's ddprun was killed"
    [ "$rc0" != 0 ] || fail "node 0 should fail"
    awk -v a="$t0" 'BEGIN { exit !(a < 12) }' || fail "not within --timeout + grace"
    grep -Eq "node 1 \($(mn_addr 1), rank 1\) stopped answering|rank [01] failed first" "$out/node-0.log" ||
      fail "node 0 named neither node 1 nor its failed rank"
    sleep 1
    nothing_left
    echo "pass: a killed node ends the job, named"
    ;;
  refused)
    start_node 0 --timeout 5 -- "$DDPTRAIN" $train --steps 2 --timeout 5
    DDP_STORE_TOKEN=another-token start_node 1 --timeout 5 -- /bin/true
    wait "$pid_1"; rc1=$?
    [ "$rc1" = 2 ] || fail "wrong token: node 1 exit $rc1, expected 2"
    grep -q "wrong token (every node of a job needs the same DDP_STORE_TOKEN)" "$out/node-1.log" ||
      fail "wrong token not named"
    cp "$out/node-1.log" "$out/token.log"
    NNODES=3 start_node 1 --timeout 5 -- /bin/true
    wait "$pid_1"; rc1=$?
    [ "$rc1" = 2 ] || fail "wrong --nnodes: node 1 exit $rc1, expected 2"
    grep -q "nnodes 3: node 0 ($(mn_addr 0)) started this job with --nnodes 2" "$out/node-1.log" ||
      fail "wrong --nnodes not named"
    # A second --node-rank 0, on another host, is refused too (it reaches node 0's store at
    # --master-addr and finds node 0 there).
    mn_exec 1 timeout -k 5 30 "$DDPRUN" --nnodes 2 --node-rank 0 --master-addr "$(mn_addr 0)" \
      --master-port "$port" --iface e1 --nproc-per-node 1 --timeout 5 -- /bin/true \
      > "$out/node-dup.log" 2>&1
    rc1=$?
    [ "$rc1" = 2 ] || fail "a second --node-rank 0: exit $rc1, expected 2"
    grep -q "node-rank 0: another ddprun has already joined this job as node 0" "$out/node-dup.log" ||
      fail "the second --node-rank 0 not named"
    wait "$pid_0"
    grep -q "store refused a connection from $(mn_addr 1)" "$out/node-0.log" ||
      fail "node 0 did not report the stranger"
    echo "pass: a wrong token, a wrong --nnodes and a second node 0 are refused, named"
    ;;
  partition)
    start_long_job
    cut_node_1
    # --timeout 5 + --grace-period 2, plus a heartbeat and a margin for a loaded machine.
    awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(a < 12 && b < 12) }' || fail "not within --timeout + grace"
    grep -q "node 1 ($(mn_addr 1), rank 1) stopped answering" "$out/node-0.log" ||
      grep -q "rank 0 failed first" "$out/node-0.log" || fail "node 0 did not name node 1 or its failed rank"
    grep -q "lost the rendezvous store at $(mn_addr 0):$port (on node 0)" "$out/node-1.log" ||
      fail "node 1 did not name node 0's store"
    grep -q "wrong token" "$out"/node-*.log && fail "a partition reported as a wrong token"
    sleep 1
    nothing_left
    echo "pass: a cut link ends both nodes, each naming the other"
    ;;
  cut)
    LAUNCHER_TIMEOUT="" start_long_job
    cut_node_1
    # 5 (collective) + 3 (store diagnosis) + 5 (silence) + 2 (grace), and a margin for load;
    # before: 300 and 600 s.
    awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(a < 22 && b < 22) }' || fail "not within the deadlines"
    grep -q "node 1 ($(mn_addr 1), rank 1) stopped answering" "$out/node-0.log" ||
      fail "node 0 did not name node 1"
    grep -q "node 0 (the rendezvous store at $(mn_addr 0):$port) stopped answering" "$out/node-1.log" ||
      grep -q "lost the rendezvous store at $(mn_addr 0):$port (on node 0)" "$out/node-1.log" ||
      fail "node 1 did not name node 0"
    sleep 1
    nothing_left
    echo "pass: a cut link ends both nodes on time with ddprun's default --timeout"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
exit 0
