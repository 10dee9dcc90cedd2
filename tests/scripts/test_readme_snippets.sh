#!/usr/bin/env bash
# The docs' command lines as a user copies them (README.md, then every page of docs/), the ones
# a CPU machine runs: every command of their ```sh blocks that starts with build/bin/ddptrain or
# build/bin/ddprun (or mpirun, where there is one) and needs no GPU, no second machine, no
# program of one's own (train.py, my_worker), no placeholder (DIR) and no folder outside its
# own, run as written in order from a work folder whose build/ is this build; each must exit 0,
# or (a launcher's long run: SECONDS, default 30, is the most it may take; one process runs to
# its end) have trained its first step when stopped. Every other line is listed with why it is
# left out (an installed prefix, an example's build, a script with a test of its own). Without
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
# The pages in the order a reader meets them: the README, the pages it sends one to first, the rest.
pages=("$root/README.md")
for page in ddptrain data-parallel pipeline launcher library libtorch; do pages+=("$root/docs/$page.md"); done
for page in "$root"/docs/*.md; do [[ " ${pages[*]} " == *" $page "* ]] || pages+=("$page"); done
# The commands: ```sh blocks, continuation lines joined, comments dropped, each after its page.
mapfile -t commands < <(for page in "${pages[@]}"; do
  echo "#page ${page#"$root"/}"
  awk '/^```sh/{f=1; next} /^```/{f=0} f' "$page" |
    sed -e 's/[[:space:]]#[^"]*$//' | awk '{ if (sub(/\\$/, "")) { line = line $0 } else { print line $0; line = "" } }'
done)
ran=0 left=0 failed=0
unfinished=" "  # weights files whose writer was stopped before its end (it writes them last)
for command in "${commands[@]}"; do
  command="$(sed -e 's/[[:space:]]\+/ /g' -e 's/^ //' -e 's/ $//' <<<"$command")"
  case "$command" in
    "#page "*) page="${command#"#page "}"; echo "== $page"; continue ;;
    "" | "#!"*) continue ;;
    build/bin/ddptrain*|build/bin/ddprun*|mpirun*) ;;
    export\ DDP_STORE_TOKEN=*) eval "$command"; continue ;;
    *)
      case "$command" in
        scripts/test.sh* | scripts/run.sh*) why="the two commands (CI runs scripts/test.sh; DepsScript.Decisions tests what they install)" ;;
        *'$HOME/ddp'* | cmake\ --install* | cmake\ -S\ examples* | g++*) why="an installed prefix (Examples.InstalledPackageBuildsAndRuns installs and builds as written)" ;;
        scripts/*) why="a script with a test or a benchmark of its own" ;;
        ddprun*) why="another node or a program of one's own (the multinode tests)" ;;
        *) why="not a ddptrain, ddprun or mpirun line" ;;
      esac
      echo "left out ($why): $command"
      left=$((left + 1))
      continue ;;
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
echo "the docs' commands: $ran ran, $left left out"
[ $ran -gt 0 ] || { echo "FAILED: no command of the docs was found to run"; exit 1; }
exit $failed
