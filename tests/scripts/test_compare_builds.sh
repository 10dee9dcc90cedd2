#!/usr/bin/env bash
# scripts/compare-builds.sh on the CPU (DEVICE=cpu): a build against itself is bitwise the
# same in every configuration (exit 0); against a build whose ddptrain trains differently (a
# wrapper that adds --lr-schedule constant) every configuration DIFFERs (exit 1). Exit 77
# (skipped) without Gloo (its dp 2 configurations).
# Usage: test_compare_builds.sh BUILD_DIR
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"
case "$("$build/bin/ddptrain" --version)" in *"gloo yes"*) ;; *) echo "skipped: built without Gloo"; exit 77 ;; esac
source "$(dirname "$0")/check_lib.sh"
export CUDA_VISIBLE_DEVICES=
same="$(DEVICE=cpu "$root/scripts/compare-builds.sh" "$build" "$build" "$work/same" 2>&1)"
check test $? -eq 0
echo "$same"
check test "$(grep -c '| bitwise the same |' <<<"$same")" -eq 17
check grep -q '| dp 2, accumulate 4 | 2 | bitwise the same |' <<<"$same"
check grep -q '| pp 2, gpipe | 2 | bitwise the same |' <<<"$same"
check grep -q '| dp 2, zero 3 | 2 | bitwise the same |' <<<"$same"
check grep -q '| dp 2, zero 3, chunks cut by eval and checkpoints | 2 | bitwise the same |' <<<"$same"
check grep -q '| pp 2, zb-v | 2 | bitwise the same |' <<<"$same"
mkdir -p "$work/other/bin"
printf '#!/bin/sh\nexec %s/bin/ddptrain "$@" --lr-schedule constant\n' "$build" > "$work/other/bin/ddptrain"
chmod +x "$work/other/bin/ddptrain"
ln -s "$build/bin/ddprun" "$work/other/bin/ddprun"
other="$(DEVICE=cpu "$root/scripts/compare-builds.sh" "$build" "$work/other" "$work/other-out" 2>&1)"
check test $? -eq 1
echo "$other"
check test "$(grep -c '| DIFFER |' <<<"$other")" -eq 17
# A build folder without ddptrain is refused, naming it.
missing="$("$root/scripts/compare-builds.sh" "$work/nowhere" "$build" 2>&1)"
check test $? -eq 2
check grep -q "nowhere/bin/ddptrain: not built" <<<"$missing"
exit $failed
