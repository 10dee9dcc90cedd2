#!/usr/bin/env bash
# scripts/deps.sh's decisions, with fake apt-get, dpkg-query, id, sudo and cmake on PATH:
# what it installs, what it leaves out, and that it goes on (or stops) as documented.
# Prints "N passed, N failed" and exits non-zero on any failure.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The system tools deps.sh uses, and nothing else (no real cmake, apt-get or compiler).
mkdir -p "$work/sys"
for tool in bash sh grep sort head sed dirname cat tr paste nproc; do
  ln -s "$(command -v "$tool")" "$work/sys/$tool"
done
passed=0
failed=0

# fake NAME BODY: a command on the fake PATH.
fake() { printf '#!/bin/bash\n%s\n' "$2" > "$work/bin/$1"; chmod +x "$work/bin/$1"; }

# A fresh fake machine: INSTALLED packages known to dpkg, apt behaviour, uid, cmake version.
machine() {
  local installed="$1" apt="$2" uid="$3" cmake_version="$4"
  rm -rf "$work/bin"; mkdir -p "$work/bin"; : > "$work/calls"
  fake dpkg-query "for p in $installed; do [ \"\${@: -1}\" = \"\$p\" ] && { echo 'install ok installed'; exit 0; }; done; exit 1"
  case "$apt" in
    ok) fake apt-get 'echo "apt-get $*" >> '"$work/calls"'; exit 0' ;;
    offline) fake apt-get 'echo "apt-get $*" >> '"$work/calls"'; [ "$1" = update ] && exit 100; exit 100' ;;
    no-gloo) fake apt-get 'echo "apt-get $*" >> '"$work/calls"'; for a in "$@"; do [ "$a" = libgloo-dev ] && exit 100; done; exit 0' ;;
  esac
  fake id "[ \"\$1\" = -u ] && echo $uid"
  fake sudo 'exit 1'
  [ -n "$cmake_version" ] && fake cmake "echo 'cmake version $cmake_version'"
  fake c++ 'exit 0'
  fake make 'exit 0'
}

# run_deps [ENV=...]: sources deps.sh in a clean shell on the fake PATH; sets out and code.
run_deps() {
  out="$(env -i HOME="$HOME" PATH="$work/bin:$work/sys" "$@" "$work/sys/bash" -c \
    "source '$root/scripts/deps.sh'; ddp_install_deps --tests" 2>&1)"
  code=$?
}

check() {  # check NAME CONDITION...
  local name="$1"
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $name"
    echo "  exit $code; output:"
    sed 's/^/    | /' <<<"$out"
    echo "  apt calls:"
    sed 's/^/    | /' "$work/calls"
  fi
}
has() { grep -q -- "$1" <<<"$out"; }
called() { grep -q -- "$1" "$work/calls"; }

everything="g++ make cmake libspdlog-dev libfmt-dev libcxxopts-dev nlohmann-json3-dev zlib1g-dev libgtest-dev pkgconf doxygen libopenblas-dev openmpi-bin libopenmpi-dev libgloo-dev libmunge-dev dataset-fashion-mnist python3-matplotlib slurm-wlm munge python3-torch python3-pip libtorch-dev"

# 1. Root, apt reaches a mirror: installs required then optional packages, nothing else.
machine "g++ make cmake" ok 0 3.25.1
run_deps
check "root+apt: exit 0" test $code -eq 0
check "root+apt: installs the required libraries" called "install -y -qq --no-install-recommends libspdlog-dev"
check "root+apt: installs the optional parts" called "libgloo-dev"
check "root+apt: updates first" called "apt-get update"

# 2. Everything installed: apt is never called.
machine "$everything" ok 0 3.25.1
run_deps
check "all there: exit 0" test $code -eq 0
check "all there: no apt call" test ! -s "$work/calls"

# 3. No mirror (apt-get update fails): says so, installs nothing, goes on (exit 0).
machine "g++" offline 0 3.25.1
run_deps
check "offline: exit 0" test $code -eq 0
check "offline: says why" has "apt-get update failed"
check "offline: no install attempted" bash -c "! grep -q 'apt-get install' '$work/calls'"

# 4. Not root, no sudo: prints the install line, calls no apt, goes on.
machine "" ok 1000 3.25.1
run_deps
check "no root: exit 0" test $code -eq 0
check "no root: says why" has "not root and no passwordless sudo"
check "no root: prints the line" has "sudo apt-get install -y"
check "no root: no apt call" test ! -s "$work/calls"

# 5. DDP_NO_INSTALL=1: nothing installed even as root.
machine "" ok 0 3.25.1
run_deps DDP_NO_INSTALL=1
check "DDP_NO_INSTALL: exit 0" test $code -eq 0
check "DDP_NO_INSTALL: no apt call" test ! -s "$work/calls"
check "DDP_NO_INSTALL: says so" has "DDP_NO_INSTALL=1"

# 6. An optional package that cannot be installed is left out, never fatal.
machine "$(echo "$everything" | sed 's/libgloo-dev//;s/openmpi-bin//')" no-gloo 0 3.25.1
run_deps
check "no gloo: exit 0" test $code -eq 0
check "no gloo: named as left out" has "optional libgloo-dev not installed"
check "no gloo: others still installed one by one" called "install -y -qq --no-install-recommends openmpi-bin"

# 7. A cmake from pip (unknown to dpkg) counts: apt is not asked for cmake.
machine "$(echo "$everything" | sed 's/ cmake / /')" ok 0 4.4.0
run_deps
check "pip cmake: exit 0" test $code -eq 0
check "pip cmake: apt not asked for cmake" bash -c "! grep -qw cmake '$work/calls'"

# 8. cmake too old and nothing can install a newer one: stops, naming cmake and the fix.
machine "$everything" ok 1000 3.16.3
run_deps
check "old cmake: exit 1" test $code -ne 0
check "old cmake: names it" has "cmake 3.16.3 is older than 3.24"

# 9. No cmake at all, offline: stops, naming cmake.
machine "g++" offline 0 ""
run_deps
check "no cmake: exit 1" test $code -ne 0
check "no cmake: names it" has "no cmake on PATH"

echo "deps: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
