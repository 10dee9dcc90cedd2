#!/usr/bin/env bash
# Nodes for multi-node tests on one machine, sourced by the tests in this folder: each node a
# network namespace (ddp-test-<pid>-<k>) with one interface e<k> at 10.77.0.<k+1>/24, joined
# by veth pairs to a bridge that lives in a namespace of its own (ddp-test-<pid>-br), so that
# nothing is added to the machine's own namespace and no traffic leaves these namespaces.
# Everything made is removed by mn_cleanup, which mn_setup installs as the EXIT/INT/TERM trap
# (a test that fails or is killed still cleans up).
#
#   mn_available          true when this machine lets us make namespaces (root, iproute2)
#   mn_setup N            makes N nodes
#   mn_exec K CMD...      runs CMD in node K
#   mn_addr K             node K's address
#   mn_cut K / mn_mend K  takes node K's link down (a silent partition: its packets are
#                         dropped, its address stays) / brings it back
#   mn_slow K RATE        shapes what the bridge sends node K to RATE (tc tbf, e.g. 4mbit)
#   mn_cleanup            kills what runs in the namespaces and removes them

MN_TAG="ddp-test-$$"
MN_NODES=0

mn_available() {
  command -v ip >/dev/null 2>&1 || return 1
  ip netns add "$MN_TAG-probe" 2>/dev/null || return 1
  ip netns del "$MN_TAG-probe"
}

mn_addr() { echo "10.77.0.$(($1 + 1))"; }

mn_cleanup() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$MN_TAG-"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}

mn_setup() {
  local n=$1 k ns
  trap mn_cleanup EXIT
  trap 'mn_cleanup; exit 130' INT
  trap 'mn_cleanup; exit 143' TERM
  ip netns add "$MN_TAG-br" || return 1
  ip -n "$MN_TAG-br" link set lo up
  ip -n "$MN_TAG-br" link add br0 type bridge || return 1
  ip -n "$MN_TAG-br" link set br0 up
  for ((k = 0; k < n; k++)); do
    ns="$MN_TAG-$k"
    ip netns add "$ns" || return 1
    ip -n "$ns" link set lo up
    ip link add "e$k" netns "$ns" type veth peer name "p$k" netns "$MN_TAG-br" || return 1
    ip -n "$ns" addr add "$(mn_addr "$k")/24" dev "e$k"
    ip -n "$ns" link set "e$k" up
    ip -n "$MN_TAG-br" link set "p$k" master br0
    ip -n "$MN_TAG-br" link set "p$k" up
  done
  MN_NODES=$n
  # The bridge learns and forwards once every port is up.
  for ((k = 1; k < n; k++)); do
    mn_exec "$k" ping -c 1 -W 2 "$(mn_addr 0)" >/dev/null 2>&1 || sleep 0.5
  done
}

mn_exec() {
  local k=$1
  shift
  ip netns exec "$MN_TAG-$k" "$@"
}

mn_cut() { ip -n "$MN_TAG-br" link set "p$1" down; }
mn_slow() {
  ip netns exec "$MN_TAG-br" tc qdisc add dev "p$1" root tbf rate "$2" burst 32kbit latency 400ms
}
mn_mend() { ip -n "$MN_TAG-br" link set "p$1" up; }
