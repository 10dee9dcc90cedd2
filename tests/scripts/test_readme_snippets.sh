#!/usr/bin/env bash
# The README's command lines as a user copies them, the ones a CPU machine runs: every command
# of its ```sh blocks that starts with build/bin/ddptrain or build/bin/ddprun (or mpirun, where
# there is one) and needs no GPU, no second machine, no program of one's own (train.py,
# my_worker), no placeholder (DIR) and no folder outside its own, run as written in order from
# a work folder whose build/ is this build; each must exit 0, or (a launcher's long run: SECONDS,
# default 30, is the most it may take; one process runs to its end) have trained its first
# step when stopped. Without
# Fashion-MNIST the lines that train on it are left out (said so).
# Usage: test_readme_snippets.sh BUILD_DIR [SECONDS]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"
seconds="${2:-30}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ln -s "$build" "$work/build"
cd "$work" || exit 1
export CUDA_VISIBLE_DEVICES= OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Fashion-MNIST where ddptrain looks for it by default?
fashion=1
build/bin/ddptrain --steps 1 --quiet > "$work/probe.log" 2>&1 || fashion=0
# The commands: ```sh blocks, continuation lines joined, comments dropped.
mapfile -t commands < <(awk '/^```sh/{f=1; next} /^```/{f=0} f' "$root/README.md" |
  sed -e 's/[[:space:]]#[^"]*$//' | awk '{ if (sub(/\\$/, "")) { line = line $0 } else { print line $0; line = "" } }')
ran=0 left=0 failed=0
unfinished=" "  # weights files whose writer was stopped before its end (it writes them last)
for command in "${commands[@]}"; do
  command="$(sed -e 's/[[:space:]]\+/ /g' -e 's/^ //' -e 's/ $//' <<<"$command")"
  case "$command" in
    build/bin/ddptrain*|build/bin/ddprun*|mpirun*) ;;
    export\ DDP_STORE_TOKEN=*) eval "$command"; continue ;;
    *) continue ;;
  esac
  why=""
  case "$command" in
    *"--device cuda"*|*"nproc-per-node gpu"*) why="a GPU" ;;
    *python3*|*train.py*|*my_worker*) why="a program of one's own" ;;
    *DIR*|*" /tmp/"*|*"=/tmp/"*) why="a folder of one's own" ;;
    mpirun*) command -v mpirun > /dev/null || why="mpirun" ;;
  esac
  if [ -z "$why" ] && [ $fashion -eq 0 ] && [[ "$command" == *ddptrain* ]] &&
    [[ "$command" != *"--data "* ]] && [[ "$command" != *"--init-weights"* ]]; then
    why="Fashion-MNIST"
  fi
  # A line that reads the weights of a one-process line stopped at its limit would fail for the
  # stop, not the README: the default training takes about 150 s on CI's machine, and once took
  # over 300 s there (both trainings stopped, then --init-weights found no file).
  if [ -z "$why" ] && [[ "$command" =~ --init-weights\ ([^ ]+) ]] &&
    [[ "$unfinished" == *" ${BASH_REMATCH[1]} "* ]]; then
    why="${BASH_REMATCH[1]}, which the line that writes it at its end did not reach in its time"
  fi
  if [ -n "$why" ]; then
    echo "left out (needs $why): $command"
    left=$((left + 1))
    continue
  fi
  start=$(date +%s)
  # One process runs to its end (a later line may read what it writes); the launchers' long
  # trainings are stopped once they have trained.
  limit=$seconds
  [[ "$command" == build/bin/ddptrain* ]] && limit=300
  timeout -k 10 "$limit" bash -c "$command" > "$work/run.log" 2>&1
  status=$?
  if [ $status -eq 0 ]; then
    echo "ran ($(( $(date +%s) - start ))s): $command"
    ran=$((ran + 1))
  elif [ $status -eq 124 ] && grep -q "first step finished" "$work/run.log"; then
    echo "trained, stopped after ${limit}s: $command"
    ran=$((ran + 1))
    [[ "$command" =~ --save-weights\ ([^ ]+) ]] && unfinished+="${BASH_REMATCH[1]} "
  else
    tail -15 "$work/run.log"
    echo "FAILED (exit $status): $command"
    failed=1
  fi
done
echo "README commands: $ran ran, $left left out"
[ $ran -gt 0 ] || { echo "FAILED: no README command was found to run"; exit 1; }
exit $failed
