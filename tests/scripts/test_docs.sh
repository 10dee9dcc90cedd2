#!/usr/bin/env bash
# The API reference builds with no warning: every public entity (include/ddp/*.h and what
# they include) has its comment (cmake/Docs.cmake, docs/Doxyfile.in). Usage: test_docs.sh
# BUILD_DIR HAVE_DOXYGEN. Exit 77 without doxygen, except under CI.
set -uo pipefail
build="$1"
if [ "$2" != 1 ]; then
  echo "doxygen was not found at configure time (apt-get install doxygen)"
  [ "${CI:-}" = true ] && { echo "FAILED: CI must build the API reference"; exit 1; }
  exit 77
fi
if ! cmake --build "$build" --target doc > "$build/api-build.log" 2>&1; then
  cat "$build/api/warnings.txt" 2>/dev/null | head -40
  tail -5 "$build/api-build.log"
  echo "FAILED: the API reference has warnings (above): document each entity named"
  exit 1
fi
pages=$(find "$build/api/html" -name '*.html' | wc -l)
echo "API reference: $pages pages in $build/api/html, no warnings"
