#!/usr/bin/env bash
# Every relative link of the docs (README.md, docs/*.md) leads to a file or folder that exists
# (and a link to a heading, page.md#anchor or #anchor, to a heading the page has), and every
# scripts/... or tests/... path they name exists: a page renamed or a script removed
# fails here, naming the page and the line. Usage: test_docs_paths.sh (from anywhere).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
status=0
checked=0
# GitHub's anchor of each heading of a page: lower case, punctuation but - and _ dropped, spaces
# to hyphens.
anchors() {
  sed -nE 's/^#+ +//p' "$1" | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}
for page in README.md docs/*.md; do
  dir="$(dirname "$page")"
  # Markdown links [text](target): not a URL, not an anchor in the page itself.
  while IFS=: read -r line target; do
    anchor=""
    [[ "$target" == *"#"* ]] && anchor="${target#*#}"
    target="${target%%#*}"
    checked=$((checked + 1))
    linked="$page"
    if [ -n "$target" ]; then
      linked="$dir/$target"
      [ -e "$linked" ] || { echo "$page:$line: links to $target, which does not exist"; status=1; continue; }
    fi
    # A link to a heading (#anchor, or page.md#anchor): the heading is there.
    if [ -n "$anchor" ] && [[ "$linked" == *.md ]] && ! anchors "$linked" | grep -qxF "$anchor"; then
      echo "$page:$line: links to ${target:-$page}#$anchor, a heading that $linked does not have"
      status=1
    fi
  done < <(grep -noE '\]\([^)[:space:]]+\)' "$page" | sed -E 's/^([0-9]+):\]\((.*)\)$/\1:\2/' |
           grep -vE ':(https?|mailto):')
  # Paths of the repository named in the text: scripts/x.sh, tests/..., docs/..., examples/...
  # (a glob such as docs/images/gpu-*.png: at least one file).
  while IFS=: read -r line path; do
    path="${path%.}"
    checked=$((checked + 1))
    compgen -G "$path" > /dev/null || { echo "$page:$line: names $path, which does not exist"; status=1; }
  done < <(grep -noE '(^|[^A-Za-z0-9_./-])(scripts|tests|docs|examples)/[A-Za-z0-9_./*-]*[A-Za-z0-9_*]' "$page" |
           sed -E 's/^([0-9]+):[^a-z]?/\1:/' | grep -vE ':(docs|tests|scripts|examples)/$')
done
echo "$checked links and paths checked in README.md and docs/*.md"
exit $status
