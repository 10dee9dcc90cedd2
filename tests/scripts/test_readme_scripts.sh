#!/usr/bin/env bash
# Every script the README names as a command (`scripts/NAME.sh` or `.py`) is there and
# executable, so that it runs as written (profile-step.sh once was not: 'Permission denied').
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
failed=0
count=0
for f in $(grep -oE '`scripts/[A-Za-z0-9_-]+\.(sh|py)' README.md | tr -d '`' | sort -u); do
  count=$((count + 1))
  [ -f "$f" ] || { echo "FAILED: README.md names $f, which is not there"; failed=1; continue; }
  [ -x "$f" ] || { echo "FAILED: README.md names $f, which is not executable (chmod +x)"; failed=1; }
done
[ "$count" -ge 10 ] || { echo "FAILED: only $count scripts found in README.md"; failed=1; }
[ "$failed" = 0 ] && echo "pass: $count scripts"
exit "$failed"
