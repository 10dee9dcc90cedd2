# Sourced by the script tests in this folder: a work folder ($work) removed when the test
# exits, and `check CMD...`, which runs CMD and, where it fails, prints it and marks the test
# failed; each test ends with `exit $failed`.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0
check() { if ! "$@"; then echo "FAILED: $*"; failed=1; fi; }
