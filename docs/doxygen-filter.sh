#!/bin/sh
# How Doxygen reads ddp's headers (docs/Doxyfile.in's INPUT_FILTER): ddp documents with plain
# `//` comments (shared/STYLE.md), so a comment line becomes a doc line (`///`), a comment
# after a declaration on its line its member's doc (`///<`), and the comment lines under
# that one, indented past the declaration, its continuation. Usage: doxygen-filter.sh HEADER.
exec awk '
function indent(s) { return match(s, /[^ \t]/) }
{
  line = $0
  if (line ~ /^[ \t]*\/\/( |$)/) {
    at = index(line, "//")
    if (trailing && indent(line) > code_indent)
      line = substr(line, 1, at - 1) "///<" substr(line, at + 2)
    else {
      trailing = 0
      line = substr(line, 1, at - 1) "///" substr(line, at + 2)
    }
    print line
    next
  }
  trailing = 0
  at = match(line, /[;{,][ \t]*\/\/ /)
  if (at) {
    length_ = RLENGTH
    code_indent = indent(line)
    line = substr(line, 1, at) " ///< " substr(line, at + length_)
    trailing = 1
  }
  print line
}' "$1"
