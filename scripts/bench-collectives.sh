#!/usr/bin/env bash
# Our collectives against nccl-tests, side by side in one run on every GPU of the machine:
# all_reduce (also in NCCL symmetric windows) and send/recv from 8 B to 512 MB. nccl-tests is built here from the source
# that scripts/device-prepare.sh --nccl-tests copied into .deps/nccl-tests (the device has
# no network); it runs one process driving every GPU (-g), ddpbench one process per GPU
# under ddprun. Prints a Markdown table per operation: nccl-tests' in-place time and busbw,
# then ddpbench's time (queued back to back, as nccl-tests times), device time (events),
# call time (each operation waited), busbw, and ddpbench's busbw over nccl-tests'.
# Usage: scripts/bench-collectives.sh BUILD_DIR [max_bytes]
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
max="${2:-536870912}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus="$(nvidia-smi -L | wc -l)"
tests=.deps/nccl-tests
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ ! -x "$tests/build/all_reduce_perf" ]; then
  [ -f "$tests/src/Makefile" ] || { echo "no nccl-tests source in $tests (scripts/device-prepare.sh --nccl-tests DIR)" >&2; exit 2; }
  make -C "$tests/src" -j"$(nproc)" MPI=0 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" NCCL_HOME="${NCCL_HOME:-/usr}" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$PWD/$tests/build" > "$tmp/make.log" 2>&1 ||
    { tail -20 "$tmp/make.log" >&2; echo "nccl-tests did not build" >&2; exit 1; }
fi
status=0
# all_reduce also with both sides' buffers in NCCL symmetric windows (nccl-tests -R 2, ddpbench
# --symmetric: NCCL's symmetric kernels), where this nccl-tests has -R.
runs=(all_reduce sendrecv)
if "$tests/build/all_reduce_perf" -h 2>&1 | grep -q -- '--local_register'; then
  runs=(all_reduce all_reduce:symmetric sendrecv)
else
  echo "(this nccl-tests has no -R: the symmetric-window run is left out)"
fi
for run in "${runs[@]}"; do
  op="${run%%:*}"
  ref_flags=()
  our_flags=()
  if [ "$run" = all_reduce:symmetric ]; then
    ref_flags=(-R 2)
    our_flags=(--symmetric)
  fi
  "$tests/build/${op}_perf" -b 8 -e "$max" -f 4 -g "$gpus" -w 5 -n 20 "${ref_flags[@]}" > "$tmp/ref.txt" 2>&1 ||
    { tail -5 "$tmp/ref.txt" >&2; status=1; continue; }
  "$build/bin/ddprun" --nproc-per-node gpu --quiet -- "$build/bin/ddpbench" collectives --device cuda \
    --op "$op" --min-bytes 8 --max-bytes "$max" --factor 4 --iters 20 --warmup 5 --json "${our_flags[@]}" \
    > "$tmp/ours.txt" 2> "$tmp/ours.err" ||
    { tail -5 "$tmp/ours.err" >&2; status=1; continue; }
  echo
  echo "$op${our_flags[*]:+ (symmetric windows: nccl-tests -R 2, ddpbench --symmetric)}, $gpus GPUs ($(grep -m1 -oE 'nccl-library=[0-9]+' "$tmp/ref.txt"), nccl-tests $(grep -m1 -oE 'nccl-tests version [0-9.]+' "$tmp/ref.txt" | awk '{print $3}'))"
  "${PYTHON:-python3}" - "$tmp/ref.txt" "$tmp/ours.txt" <<'PY' || status=1
import json, re, sys
ref = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 13 and f[0].isdigit():
        # size count type redop root | out-of-place time algbw busbw wrong | in-place ...
        ref[int(f[0])] = (float(f[-4]), float(f[-2]))
line = [l for l in open(sys.argv[2]) if "[{" in l][-1]  # ddprun prefixes "[rank 0] "
rows = json.loads(line[line.index("[{"):])
print("| bytes | nccl-tests us | nccl-tests busbw GB/s | ddpbench us | device us | call us | ddpbench busbw GB/s | busbw ratio | wrong |")
print("|---|---|---|---|---|---|---|---|---|")
bad = 0
for r in rows:
    t, bw = ref.get(r["bytes"], (float("nan"), float("nan")))
    ratio = r["busbw_gbs"] / bw if bw and bw == bw and bw > 0 else float("nan")
    dev = "-" if r.get("device_us") is None else "%.1f" % r["device_us"]
    print(f"| {r['bytes']} | {t:.1f} | {bw:.2f} | {r['time_us']:.1f} | {dev} | {r['call_us']:.1f} | "
          f"{r['busbw_gbs']:.2f} | {ratio:.2f} | {r['wrong']} |")
    bad += r["wrong"] != 0
sys.exit(1 if bad else 0)
PY
done
echo "(commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); busbw as nccl-tests defines it; nccl-tests in place, one process, -g $gpus; ddpbench one process per GPU under ddprun)"
exit $status
