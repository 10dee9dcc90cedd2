#!/usr/bin/env bash
# scripts/bench-flags.sh against a stand-in ddptrain (no GPU needed): each configuration's
# flags reach ddptrain, every cell is the median of the rounds with the fastest and slowest,
# a failed configuration shows "-" and makes the exit 1, and bad arguments are refused (exit 2)
# naming what was expected.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(dirname "$0")/check_lib.sh"
mkdir -p "$work/build/bin"
# The stand-in: 1e6 samples/s, 2e6 with --weight-grad-stream on, times 1.0, 1.1, 1.2 on the
# configuration's first, second, third run; --fail fails.
cat > "$work/build/bin/ddptrain" <<STUB
#!/usr/bin/env bash
rate=1000000; key=off; metrics=
while [ \$# -gt 0 ]; do
  case "\$1" in
    --metrics) metrics="\$2"; shift ;;
    --weight-grad-stream) [ "\$2" = on ] && { rate=2000000; key=on; }; shift ;;
    --fail) echo "stand-in: asked to fail" >&2; exit 1 ;;
  esac
  shift
done
n=\$(cat "$work/count-\$key" 2>/dev/null | wc -l); echo x >> "$work/count-\$key"
echo "{\"steady_samples_per_s\": \$(awk -v r=\$rate -v n=\$n 'BEGIN { print r * (1 + (n % 3) / 10) }')}" > "\$metrics"
STUB
chmod +x "$work/build/bin/ddptrain"
out="$(ROUNDS=3 DDP_COMMIT=abc1234 "$root/scripts/bench-flags.sh" "$work/build" "one=--weight-grad-stream off" \
  "two=--weight-grad-stream on" -- tiny:tf32 2>&1)"
check test $? -eq 0
echo "$out"
check grep -q '^| workload | prec | one ms | two ms |$' <<<"$out"
# batch 128: 0.128 ms at 1e6 samples/s over 1.0, 1.1, 1.2; half that at 2e6.
check grep -qF '| tiny | tf32 | 0.1164 (0.1067-0.1280) | 0.0582 (0.0533-0.0640) |' <<<"$out"
check grep -q 'commit abc1234; ms a step, median of 3 rounds' <<<"$out"
bad="$(ROUNDS=1 "$root/scripts/bench-flags.sh" "$work/build" "ok=" "broken=--fail" -- medium:bf16 2>&1)"
check test $? -eq 1
echo "$bad"
check grep -qF "bench-flags: medium:bf16 'broken' failed: stand-in: asked to fail" <<<"$bad"
check grep -qE '^\| medium \| bf16 \| [0-9.]+ \([0-9.-]+\) \| - \|$' <<<"$bad"
for args in "nameless" "ok= -- huge:tf32" ""; do
  # shellcheck disable=SC2086
  refused="$(ROUNDS=1 "$root/scripts/bench-flags.sh" "$work/build" $args 2>&1)"
  check test $? -eq 2
  echo "$refused"
done
check grep -q "'nameless': expected NAME=FLAGS" <<<"$(ROUNDS=1 "$root/scripts/bench-flags.sh" "$work/build" nameless 2>&1)"
check grep -q "unknown workload huge" <<<"$(ROUNDS=1 "$root/scripts/bench-flags.sh" "$work/build" ok= -- huge:tf32 2>&1)"
check grep -q "ROUNDS 0: expected a count" <<<"$(ROUNDS=0 "$root/scripts/bench-flags.sh" "$work/build" ok= 2>&1)"
check grep -q "no bin/ddptrain there" <<<"$("$root/scripts/bench-flags.sh" "$work/nowhere" ok= 2>&1)"
exit $failed
