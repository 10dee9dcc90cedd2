#!/usr/bin/env bash
# Two builds of ddptrain (say the commit before a change and after it) trained alike: the
# weights after 40 steps must be bitwise the same, alone and data-parallel, in several
# configurations (accumulation, checkpoints and evaluation cutting the run into chunks, and on
# the GPU the overlapped optimizer, no graph, bf16 gradients), two-stage pipelines under every
# schedule, and ZeRO 1, 2 and 3. On the GPU the two ranks share
# this machine's one GPU (ddprun --share-gpu, NCCL over sockets); DEVICE=cpu compares the CPU
# path (two ranks over Gloo). Prints a Markdown table; exits non-zero when any configuration
# differs or fails.
# Usage: [DEVICE=cpu] [ONLY=REGEX] scripts/compare-builds.sh OLD_BUILD NEW_BUILD [OUT_DIR]
#   ONLY: run only the configurations whose names match this extended regex (grep -E), in
#   the table's order (a short device call; the full table is the check).
set -uo pipefail
cd "$(dirname "$0")/.."
old="${1:?usage: scripts/compare-builds.sh OLD_BUILD NEW_BUILD [OUT_DIR]}"
new="${2:?usage: scripts/compare-builds.sh OLD_BUILD NEW_BUILD [OUT_DIR]}"
out="${3:-$(mktemp -d)}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for b in "$old" "$new"; do
  [ -x "$b/bin/ddptrain" ] || { echo "compare-builds: $b/bin/ddptrain: not built" >&2; exit 2; }
done

device="${DEVICE:-cuda}"
layers=256,512,512,512,10  # four layers: interleaved 1F1B puts two on each of 2 ranks
[ "$device" = cpu ] && layers=64,256,128,128,10  # a few seconds for every run on two cores
base=(--device "$device" --data synthetic --layers "$layers" --synthetic-samples 8192 --batch-size 256
      --steps 40 --lr 0.05 --quiet)
# name | ranks | flags
configs=(
  "plain|1|"
  "adamw, accumulate 4|1|--optimizer adamw --accumulate 4"
  "chunks cut by eval and checkpoints|1|--log-every 7 --eval-every 5 --checkpoint-every 9 --checkpoint-dir CKPT"
  "dp 2|2|--bucket-mb 0.2 --first-bucket-mb 0.05"
  "dp 2, accumulate 4|2|--accumulate 4 --bucket-mb 0.2"
  "pp 2, 1f1b|2|--pp 2 --micro-batches 4 --schedule 1f1b"
  "pp 2, gpipe|2|--pp 2 --micro-batches 4 --schedule gpipe"
  "pp 2, pairs|2|--pp 2 --micro-batches 4 --schedule pairs"
  "pp 2, zb-h1|2|--pp 2 --micro-batches 4 --schedule zb-h1"
  "pp 2, interleaved-1f1b|2|--pp 2 --micro-batches 4 --schedule interleaved-1f1b"
  "pp 2, zb-v|2|--pp 2 --micro-batches 4 --schedule zb-v"
  "dp 2, zero 1|2|--zero 1 --optimizer adamw --bucket-mb 0.2"
  "dp 2, zero 2|2|--zero 2 --optimizer adamw --bucket-mb 0.2"
  "dp 2, zero 3|2|--zero 3 --optimizer adamw"
  "dp 2, zero 3, chunks cut by eval and checkpoints|2|--zero 3 --optimizer adamw --log-every 7 --eval-every 5 --checkpoint-every 9 --checkpoint-dir CKPT"
  "dp 2, zero 2, gradient ring (many equal layers)|2|--zero 2 --optimizer adamw --layers 64,128,128,128,128,128,128,128,128,10 --bucket-mb 0.02 --first-bucket-mb 0.01"
  "dp 2, zero 2, accumulate 2|2|--zero 2 --accumulate 2 --bucket-mb 0.2"
)
share=()
if [ "$device" = cuda ]; then
  share=(--share-gpu)
  configs+=(
    "overlapped optimizer|1|--overlap-optimizer"
    "no graph|1|--no-cuda-graph"
    "dp 2, overlapped optimizer|2|--overlap-optimizer --bucket-mb 0.2"
    "dp 2, bf16 gradients|2|--grad-reduce bf16"
  )
fi
failed=0
ran=0
printf '| configuration | ranks | weights | old s | new s |\n|---|---|---|---|---|\n'
i=0
for entry in "${configs[@]}"; do
  IFS='|' read -r name ranks flags <<<"$entry"
  i=$((i + 1))
  [ -z "${ONLY:-}" ] || grep -qE "$ONLY" <<<"$name" || continue
  ran=$((ran + 1))
  times=()
  for side in old new; do
    build="$old"; [ "$side" = new ] && build="$new"
    run="$out/$i-$side"
    rm -rf "$run"; mkdir -p "$run"
    # shellcheck disable=SC2086
    set -- ${flags//CKPT/$run/ckpt}
    start=$(date +%s.%N)
    if [ "$ranks" -eq 1 ]; then
      timeout 180 "$build/bin/ddptrain" "${base[@]}" "$@" --save-weights "$run/w.safetensors" > "$run/log" 2>&1
    else
      timeout 300 "$build/bin/ddprun" "${share[@]}" --nproc-per-node "$ranks" -- "$build/bin/ddptrain" \
        "${base[@]}" "$@" --save-weights "$run/w.safetensors" > "$run/log" 2>&1
    fi
    rc=$?
    times+=("$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')")
    [ $rc -eq 0 ] || { echo "compare-builds: $name ($side) exited $rc:" >&2; tail -3 "$run/log" >&2; }
  done
  if [ -s "$out/$i-old/w.safetensors" ] && cmp -s "$out/$i-old/w.safetensors" "$out/$i-new/w.safetensors"; then
    verdict="bitwise the same"
  else
    verdict="DIFFER"
    failed=1
  fi
  printf '| %s | %s | %s | %s | %s |\n' "$name" "$ranks" "$verdict" "${times[0]}" "${times[1]}"
done
if [ -n "${ONLY:-}" ]; then
  [ "$ran" -gt 0 ] || { echo "compare-builds: ONLY='$ONLY' matches no configuration's name" >&2; exit 2; }
  echo "(only the configurations matching '$ONLY')"
fi
echo "(old: $old, new: $new; each configuration 40 steps of ${base[*]:4:2} on $device, fp32; logs in $out)"
exit $failed
