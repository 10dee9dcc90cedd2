#!/usr/bin/env bash
# Every script the docs (README.md, docs/*.md) name as a command (`scripts/NAME.sh` or `.py`) is
# there and executable, so that it runs as written (profile-step.sh once was not: 'Permission
# denied').
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
failed=0
count=0
for f in $(cat README.md docs/*.md | grep -oE '`scripts/[A-Za-z0-9_-]+\.(sh|py)' | tr -d '`' | sort -u); do
  count=$((count + 1))
  page="$(grep -l "\`$f" README.md docs/*.md | head -1)"
  [ -f "$f" ] || { echo "FAILED: $page names $f, which is not there"; failed=1; continue; }
  # A file of functions the scripts source (its first lines say "Sourced by") is not a command.
  head -4 "$f" | grep -q "Sourced by" && continue
  [ -x "$f" ] || { echo "FAILED: $page names $f, which is not executable (chmod +x)"; failed=1; }
done
[ "$count" -ge 10 ] || { echo "FAILED: only $count scripts found in the docs"; failed=1; }
[ "$failed" = 0 ] && echo "pass: $count scripts"
exit "$failed"
