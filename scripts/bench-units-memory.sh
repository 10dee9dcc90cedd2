#!/usr/bin/env bash
# Sharding at the peak for a LibTorch model (issue 72): tests/libtorch/unit_worker's Sequential of
# BLOCKS equal residual blocks (layer norm, DIM x DIM linear) with AdamW, trained 3 steps on R
# ranks as plain DistributedDataParallel, zero(1), zero(2), zero(3) without units, with
# ddp::ShardUnit blocks, and with units and the bf16 parameter policy. For each, rank 0's figures
# over steps 2 and 3: the most its allocator held during a step (forward, backward and the
# optimizer's step), the growth from the forward's start to the end of backward, what ddp held
# between steps, and the optimizer's state. On the GPU (the default) the CUDA caching
# allocator's counters of each process, the ranks sharing one GPU (ddprun --share-gpu: NCCL over
# sockets; memory is per process either way, so this is a memory figure, never a speed one);
# DEVICE=cpu counts the CPU allocator (Gloo).
# The rows fsdp2 and fsdp2-bf16 are PyTorch's FSDP2 on the same model (scripts/torch_units.py:
# `fully_shard` on each block and the root, bf16 parameters through its MixedPrecisionPolicy),
# with the Python that has torch 2.6 or later (DDP_PYTHON, else python3). Each row's mean step
# time is a speed figure only with SHARE=0 on a machine of as many GPUs as ranks (a rank a GPU).
# Prints a Markdown table. Usage:
#   [DEVICE=cpu] [BLOCKS=60] [DIM=4096] [RANKS="2 4"] [ROWS=...] [UNIT=MB] [SHARE=0] scripts/bench-units-memory.sh BUILD_DIR
# The defaults are a model of 1.007 B parameters (4.03 GB in float32). ROWS: the rows' names to
# run (plain zero1 zero2 zero3 units units-bf16); a rank count above 2 runs only the units rows
# (plain DDP's AdamW at 4 ranks of a 1 B model would not fit 4 processes in one H100).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
build="${1:?usage: scripts/bench-units-memory.sh BUILD_DIR}"
worker="$build/bin/ddp_torch_unit_worker"
[ -x "$worker" ] || worker="$(find "$build" -name ddp_torch_unit_worker -type f -perm -u+x | head -1)"
[ -x "$worker" ] || { echo "bench-units-memory: no ddp_torch_unit_worker under $build" >&2; exit 2; }
device="${DEVICE:-cuda}"
blocks="${BLOCKS:-60}"
dim="${DIM:-4096}"
ranks_list="${RANKS:-2 4}"
rows="${ROWS:-plain zero1 zero2 zero3 units units-bf16 fsdp2 fsdp2-bf16}"
py="${DDP_PYTHON:-python3}"
launch=("$build/bin/ddprun")
common=(--steps 3 --batch 8 --blocks "$blocks" --dim "$dim")
flags=(--peak --adamw)
if [ "$device" = cpu ]; then
  export CUDA_VISIBLE_DEVICES=
else
  [ "${SHARE:-1}" = 1 ] && launch+=(--share-gpu)
  common+=(--cuda)
fi
declare -A row_flags=([plain]="" [zero1]="--zero 1" [zero2]="--zero 2" [zero3]="--zero 3"
  [units]="--zero 3 --units" [units-bf16]="--zero 3 --units --bf16-params" [fsdp2]=""
  [fsdp2-bf16]="--bf16-params")
unit="${UNIT:-GB}"  # or MB, for small models
divisor=1e9; [ "$unit" = MB ] && divisor=1e6
gb() { awk -v b="$1" -v d="$divisor" 'BEGIN { printf "%.2f", b / d }'; }
u="$unit"
echo "| run | ranks | model $u | a step's peak $u | growth in forward + backward $u | held between steps $u | optimizer state $u | peak / plain's | ms a step |"
echo "|---|---|---|---|---|---|---|---|---|"
status=0
for ranks in $ranks_list; do
  plain_peak=""
  for row in $rows; do
    case "$row" in units*|fsdp2*) ;; *) [ "$ranks" -gt 2 ] && continue ;; esac
    log="$(mktemp)"
    # shellcheck disable=SC2086
    case "$row" in
      fsdp2*) program=("$py" scripts/torch_units.py) ;;
      *) program=("$worker" "${flags[@]}") ;;
    esac
    if ! "${launch[@]}" --nproc-per-node "$ranks" -- "${program[@]}" "${common[@]}" ${row_flags[$row]} > "$log" 2>&1; then
      echo "| $row | $ranks | failed: $(grep -m1 -iE 'error|out of memory' "$log" | cut -c1-120) |"
      status=1
      rm -f "$log"
      continue
    fi
    line="$(grep -m1 -oE 'rank 0 window .*' "$log")"
    rm -f "$log"
    read -r _ _ _ window _ held _ ledger _ model _ block _ optimizer _ peak _ step_ms <<< "$line"
    [ "$row" = plain ] && plain_peak="$peak"
    ratio="-"
    [ -n "$plain_peak" ] && ratio="$(awk -v a="$peak" -v b="$plain_peak" 'BEGIN { printf "%.2fx", a / b }')"
    echo "| $row | $ranks | $(gb "$model") | $(gb "$peak") | $(gb "$window") | $(gb "$held") | $(gb "$optimizer") | $ratio | $step_ms |"
  done
done
echo "(commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $device$([ "$device" = cuda ] && [ "${SHARE:-1}" = 1 ] && echo ', ranks sharing one GPU: ms a step is not a speed figure'))"
exit $status
