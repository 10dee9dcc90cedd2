#!/usr/bin/env bash
# scripts/bench-vs-torch.sh against a stand-in ddptrain and a stand-in PyTorch (no GPU needed):
# each row compares ddptrain with PyTorch's fastest mode, torch.compile runs on tiny and medium
# but not on large (its compiling would not fit a device call; TORCH_COMPILE_ALL=1 brings it
# back), and --warm compiles only where the table will.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(dirname "$0")/check_lib.sh"
real_python="$(command -v python3)"
mkdir -p "$work/build/bin"
# ddptrain: 2e6 samples/s (tiny's batch of 128: 0.064 ms a step), 2e5 on large (4096: 20.48 ms).
cat > "$work/build/bin/ddptrain" <<'STUB'
#!/usr/bin/env bash
rate=2000000; metrics=
while [ $# -gt 0 ]; do
  case "$1" in
    --metrics) metrics="$2"; shift ;;
    --layers) [ "${2%%,*}" = 8192 ] && rate=200000; shift ;;
  esac
  shift
done
[ -z "$metrics" ] || echo "{\"steady_samples_per_s\": $rate}" > "$metrics"
STUB
# PyTorch: every torch_mlp.py call logged with its mode; eager 1.0 ms, graph 0.1, compile 0.08
# (times 200 on large: 200, 20, 16 ms; compile would win there if it ran).
cat > "$work/python" <<STUB
#!/usr/bin/env bash
case "\${1:-}" in
  scripts/torch_mlp.py)
    mode=eager; scale=1
    for a in "\$@"; do [ "\$prev" = --mode ] && mode="\$a"; [ "\$prev" = --layers ] && [ "\${a%%,*}" = 8192 ] && scale=200; prev="\$a"; done
    echo "\$mode \$scale" >> "$work/torch.log"
    case "\$mode" in eager) ms=1.0 ;; graph) ms=0.1 ;; compile) ms=0.08 ;; esac
    echo "{\"ms_per_step\": \$(awk -v m=\$ms -v s=\$scale 'BEGIN { print m * s }')}" ;;
  scripts/torch_matmul_rate.py) echo '{"matmul_ms": 0.05, "limit_ms": 0.01}' ;;
  *) exec "$real_python" "\$@" ;;
esac
STUB
chmod +x "$work/build/bin/ddptrain" "$work/python"
export PYTHON="$work/python"
out="$(DDP_COMMIT=abc1234 "$root/scripts/bench-vs-torch.sh" "$work/build" tiny:tf32 large:bf16 2>&1)"
check test $? -eq 0
echo "$out"
# tiny: 0.064 ms against compile's 0.08; large: 20.48 against graph's 20 (compile not run).
check grep -qE '^\| tiny \| tf32 \| 0\.064 \| 1\.000 \|.*\| 0\.100 \| 0\.080 \|.* 1\.25x \|$' <<<"$out"
check grep -qE '^\| large \| bf16 \| 20\.480 \| 200\.000 \|.*\| 20\.000 \| - \|.* 0\.98x \|$' <<<"$out"
check grep -q 'commit abc1234' <<<"$out"
check grep -q 'torch.compile "-" on large' <<<"$out"
check test "$(grep -c '^compile 200$' "$work/torch.log")" -eq 0
check test "$(grep -c '^compile 1$' "$work/torch.log")" -eq 1
rm -f "$work/torch.log"
TORCH_COMPILE_ALL=1 "$root/scripts/bench-vs-torch.sh" "$work/build" large:tf32 > "$work/all.md" 2>&1
check grep -qE '^\| large \| tf32 \| 20\.480 \|.*\| 20\.000 \| 16\.000 \|.* 0\.78x \|$' "$work/all.md"
rm -f "$work/torch.log"
warm="$("$root/scripts/bench-vs-torch.sh" --warm "$work/build" tiny:bf16 large:tf32 2>&1)"
check test $? -eq 0
echo "$warm"
check grep -q '^warmed tiny:bf16 in ' <<<"$warm"
check grep -q '^warmed large:tf32 in ' <<<"$warm"
check test "$(cat "$work/torch.log")" = "compile 1"
check grep -q "unknown workload huge" <<<"$("$root/scripts/bench-vs-torch.sh" "$work/build" huge:tf32 2>&1)"
exit $failed
