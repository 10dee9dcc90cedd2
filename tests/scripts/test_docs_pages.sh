#!/usr/bin/env bash
# The docs as a map (issue 75): README.md at most 350 lines with its parts (the two commands,
# three quickstarts, the feature table, the map of the docs, help); every page under docs/
# starts with its purpose (a paragraph "For ..." under its title); no page speaks of the
# sessions the work was done in; docs/PERFORMANCE.md's headline table has one row for every
# workload of scripts/workloads.sh and every model and dtype of scripts/bench-libtorch.sh; the
# README's C++ quickstart is the lines of the example it names (the LibTorch one is built and run
# as written: Readme.LibTorchQuickstartRunsAsWritten).
# Usage: test_docs_pages.sh (from anywhere).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
status=0
fail() { echo "FAILED: $*"; status=1; }

lines=$(wc -l < README.md)
[ "$lines" -le 350 ] || fail "README.md has $lines lines (at most 350: move the detail to a page under docs/)"
for part in "## The two commands" "## Quickstart: a torchrun" "## Quickstart: data-parallel training from your own C++" \
  "## Quickstart: a LibTorch program" "## What it does" "## The docs" "## Getting help"; do
  grep -q "^$part" README.md || fail "README.md lacks its part '$part'"
done
# Every page of docs/ is in the README's map.
for page in docs/*.md; do
  grep -q "](${page})" README.md || [ "$page" = docs/performance-history.md ] ||
    fail "README.md's map does not link $page"
done

# A block marked <!-- quickstart-cpp: FILE --> is FILE's own lines: each of its code lines
# (comments dropped, spaces squeezed) is a line of FILE, a program the tests build and run.
normalise() { sed -E 's#[[:space:]]*//.*$##; s/[[:space:]]+/ /g; s/^ //; s/ $//' | grep -v '^$'; }
while IFS= read -r marker; do
  source_file="$(sed -E 's/.*quickstart-cpp: ([^ ]+) -->.*/\1/' <<<"$marker")"
  [ -f "$source_file" ] || { fail "README.md's quickstart names $source_file, which is not there"; continue; }
  block="$(awk -v m="$marker" '$0 == m { on = 1; next } on && /^```cpp/ { next } on && /^```/ { exit } on' README.md | normalise)"
  [ -n "$block" ] || fail "README.md: no code block after '$marker'"
  lines_of_file="$(normalise < "$source_file")"
  while IFS= read -r line; do
    grep -qxF -- "$line" <<<"$lines_of_file" || fail "README.md's quickstart line is not $source_file's: $line"
  done <<<"$block"
done < <(grep -E '^<!-- quickstart-cpp: ' README.md)

for page in docs/*.md; do
  head -1 "$page" | grep -q '^# ' || fail "$page does not start with its title ('# ...')"
  # The first paragraph after the title says whom the page is for.
  first="$(awk 'NR > 1 && NF { print; exit }' "$page")"
  [[ "$first" == For\ * ]] || fail "$page: the paragraph under the title should say what the page is for ('For ...'), not: $first"
done

# Sessions are how the work was organised, not what a reader needs; a Unix session (setsid)
# is the one kind a page may name.
while IFS= read -r hit; do
  fail "speaks of sessions: $hit"
done < <(grep -inH 'session' README.md docs/*.md | grep -v 'setsid')

# The headline table: the rows between its heading and the next heading.
table="$(awk '/^## The headline table/ { on = 1; next } on && /^## / { exit } on && /^\| /' docs/PERFORMANCE.md)"
[ -n "$table" ] || fail "docs/PERFORMANCE.md has no '## The headline table'"
source scripts/workloads.sh
rows=0
for run in "${ddp_default_runs[@]}"; do
  name="${run%%:*} ${run##*:}"
  count=$(grep -c "^| $name, one GPU" <<<"$table")
  [ "$count" = 1 ] || fail "the headline table has $count rows for '$name, one GPU' (expected one)"
  rows=$((rows + 1))
done
models="$(sed -nE 's/^models=([a-z,]+)$/\1/p' scripts/bench-libtorch.sh)"
dtypes="$(sed -nE 's/^dtypes=([a-z0-9,]+)$/\1/p' scripts/bench-libtorch.sh)"
[ -n "$models" ] && [ -n "$dtypes" ] || fail "scripts/bench-libtorch.sh's default models or dtypes not found"
for model in ${models//,/ }; do
  for dtype in ${dtypes//,/ }; do
    count=$(grep -c "^| $model $dtype[ ,]" <<<"$table")
    [ "$count" = 1 ] || fail "the headline table has $count rows for LibTorch's '$model $dtype' (expected one)"
    rows=$((rows + 1))
  done
done
# Each row: ddp's figure, the reference, the ratio, the limit's share, commit, device, date.
while IFS= read -r row; do
  cells=$(awk -F'|' '{ print NF - 2 }' <<<"$row")
  [ "$cells" = 8 ] || fail "a headline row has $cells cells (expected 8): $row"
  grep -qE '\| [0-9a-f]{7} \| [^|]+ \| 20[0-9]{2}-[0-9]{2}-[0-9]{2} \|$' <<<"$row" ||
    fail "a headline row lacks its commit, device or date: $row"
done < <(grep -v -e '^|---' -e '^| workload |' <<<"$table")
echo "README.md $lines lines; $(ls docs/*.md | wc -l) pages; $rows workload rows checked"
exit $status
