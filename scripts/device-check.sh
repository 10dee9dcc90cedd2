#!/usr/bin/env bash
# Everything that needs a GPU, in one call on the device machine. It uses the README's two
# commands as a newcomer would: `scripts/test.sh` (install what it can, build, every test,
# the GPU ones included) and `scripts/run.sh` (Fashion-MNIST on the GPU); then the launcher,
# options and benchmarks. Logs go to $OUT (or ./device-out); a short table is printed last,
# and the exit status is non-zero when any check failed, the failing sections named last.
# Usage: scripts/device-check.sh [sections...]
#   sections: build test cuda cuda1 cuda2 run doctor launcher fashion monitor options ddp1 multi bench-warm
#   bench fused profile bench-ddp collectives levers pipeline zero torch libtorch libtorch-shapes
#   libtorch-ranks
#   (build: only the build; torch: only the LibTorch targets and their GPU tests, TorchDdpCuda.*, TorchPipelineCuda.*, TorchUsersCuda.* and TorchUnitsCuda.*,
#   about 2 minutes from a fresh machine; libtorch and libtorch-shapes: bench-libtorch.sh's cnn and
#   mlp, then resnet and transformer, fp32 and bf16, a call each; cuda: build and only
#   the GPU tests, `ctest -L cuda`, when CI has run the rest; cuda1 and cuda2: each half of
#   them, one a call, as the whole runs past the device's 10 minutes; bench-warm: bench-vs-torch.sh
#   --warm, the compile caches that let `bench` fit in the next call on a warm machine; default: test run bench; multi, bench-ddp, collectives, levers, pipeline, zero and libtorch-ranks need two or more
#   GPUs; collectives needs nccl-tests' source: scripts/device-prepare.sh --nccl-tests DIR)
# Expects .deps/ (made by scripts/device-prepare.sh here): fashion-mnist/, and zlib/ and
# json/, prefixes of the headers the device image lacks (on CMAKE_PREFIX_PATH, nothing else).
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on shared machines, in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Logs are kept in a work folder and packed into $OUT/logs.tgz at the end (the device tool
# brings back only a few files).
out="$(mktemp -d)"
dest="${OUT:-$PWD/device-out}"
mkdir -p "$dest"
trap 'tar -C "$out" -czf "$dest/logs.tgz" . 2>/dev/null' EXIT
trap 'echo "== stopped by SIGTERM (a timeout)"; printf "%s\n" "${summary[@]}"; exit 143' TERM
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(test run bench)
want() { local s; for s in "${sections[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
export DDP_BUILD_DIR="$PWD/build-gpu"
export DDP_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$PWD/.deps/zlib;$PWD/.deps/json -DCMAKE_CUDA_ARCHITECTURES=90"
build="$DDP_BUILD_DIR"
summary=()
failed=()
note() { summary+=("$1"); echo "== $1"; }
fail() { failed+=("$1"); note "FAILED $1: $2"; }

# The GPU tests: all (cuda), or every other one (cuda1: the odd-numbered, cuda2: the even),
# so that each half with the build fits in one 10-minute device call.
for section in cuda cuda1 cuda2; do
  want "$section" || continue
  case "$section" in cuda1) pick=(-I 1,,2) ;; cuda2) pick=(-I 2,,2) ;; *) pick=() ;; esac
  start=$(date +%s)
  if (source scripts/deps.sh && ddp_build) > "$out/build.log" 2>&1 &&
    (cd "$build" && ctest -L cuda "${pick[@]}" -j 8 --timeout 150 --output-on-failure) > "$out/$section.log" 2>&1; then
    note "ctest -L cuda ${pick[*]}: $(grep -E 'tests passed|tests failed' "$out/$section.log" | tail -1) in $(( $(date +%s) - start ))s with the build"
  else
    grep -E 'error:|\(Failed|\(Timeout|Expected|Which is' "$out/build.log" "$out/$section.log" | head -20
    fail "$section" "$(grep -E 'tests passed|tests failed' "$out/$section.log" 2>/dev/null | tail -1)"
  fi
done

if want build; then
  start=$(date +%s)
  if (source scripts/deps.sh && ddp_build) > "$out/build.log" 2>&1; then
    note "build: $(( $(date +%s) - start ))s"
  else
    grep -E 'error:' "$out/build.log" | head -20
    fail build "$(tail -1 "$out/build.log")"
  fi
fi

if want torch; then
  # The LibTorch component alone (the wheel's LibTorch): its targets built, its GPU tests run.
  start=$(date +%s)
  if (source scripts/deps.sh && ddp_configure) > "$out/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" --target ddp_torch_cuda_tests ddp_torch_worker ddp_torch_unit_worker ddprun \
      ddp_torch_bench >> "$out/build.log" 2>&1 &&
    (cd "$build" && ctest -R 'TorchDdpCuda|TorchPipelineCuda|TorchUsersCuda|TorchUnitsCuda' -j 8 --timeout 250 --output-on-failure) > "$out/torch.log" 2>&1; then
    note "torch: $(grep -E 'tests passed|tests failed' "$out/torch.log" | tail -1) in $(( $(date +%s) - start ))s with the build"
  else
    grep -E 'error:|\(Failed|\(Timeout|Expected|Which is|actual' "$out/build.log" "$out/torch.log" 2>/dev/null | head -20
    fail torch "$(grep -E 'tests passed|tests failed' "$out/torch.log" 2>/dev/null | tail -1)"
  fi
fi

if want test || { ! want cuda && ! want cuda1 && ! want cuda2 && ! want torch && ! want libtorch && ! want libtorch-shapes && ! want libtorch-ranks && [ ! -x "$build/bin/ddptrain" ]; }; then
  start=$(date +%s)
  if scripts/test.sh -j 8 --timeout 150 > "$out/test.log" 2>&1; then
    note "scripts/test.sh: $(grep -E 'tests passed|tests failed' "$out/test.log" | tail -1) in $(( $(date +%s) - start ))s"
  else
    grep -E 'deps:|found:|left out:|Error|error:' "$out/test.log" | head -20
    grep -E '\(Failed|\(Timeout|\(SEGFAULT|Not Run' "$out/test.log" | head -20
    fail test "$(grep -E 'tests passed|tests failed' "$out/test.log" | tail -1)"
  fi
  grep -E 'found:|left out:|deps:|header-only|zlib from' "$out/test.log"
  grep -E 'Skipped' "$out/test.log" | head -5
  [ -x "$build/bin/ddptrain" ] || { printf '%s\n' "${summary[@]}"; exit 1; }
fi

if want run; then
  start=$(date +%s)
  timeout 300 scripts/run.sh --data-dir .deps/fashion-mnist --metrics "$out/run.jsonl" > "$out/run.log" 2>&1
  accuracy="$(grep -oE 'test accuracy [0-9.]+' "$out/run.log" | tail -1 | awk '{print $3}')"
  if [ -n "$accuracy" ] && awk -v a="$accuracy" 'BEGIN { exit !(a >= 89.5) }'; then
    note "scripts/run.sh on the GPU: $(grep -E 'test accuracy' "$out/run.log" | sed 's/.*info: //') ($(( $(date +%s) - start ))s with the build check)"
  else
    tail -20 "$out/run.log"
    fail run "test accuracy '${accuracy:-none}' (want 89.5 or more)"
  fi
fi

if want doctor; then
  "$build/bin/ddpdoctor" > "$out/doctor.log" 2>&1
  cat "$out/doctor.log"
  note "ddpdoctor: $(tail -1 "$out/doctor.log")"
fi

if want launcher; then
  {
    echo "\$ ddprun --nproc-per-node gpu -- ddp_test_worker bind 6"
    "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddp_test_worker" bind 6 &
    pid=$!
    sleep 4
    echo "\$ nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv"
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
    echo "\$ nvidia-smi --query-gpu=index,uuid --format=csv"
    nvidia-smi --query-gpu=index,uuid --format=csv
    wait $pid
    echo "exit $?"
    echo "\$ CUDA_VISIBLE_DEVICES=0,0 ddprun --nproc-per-node 2 -- ddp_test_worker bind"
    CUDA_VISIBLE_DEVICES=0,0 "$build/bin/ddprun" --nproc-per-node 2 -- "$build/bin/ddp_test_worker" bind
    echo "exit $?"
  } > "$out/launcher.log" 2>&1
  cat "$out/launcher.log"
  note "launcher: $(grep -c 'bind ok' "$out/launcher.log") workers bound; duplicate check: $(grep -c 'two ranks on one GPU' "$out/launcher.log") messages"
  [ "$(grep -c 'bind ok' "$out/launcher.log")" -ge 1 ] || fail launcher "no worker bound its GPU"
  grep -q 'two ranks on one GPU' "$out/launcher.log" || fail launcher "two ranks on one GPU were not refused"
fi

if want fashion; then
  for prec in fp32 tf32; do
    timeout 120 "$build/bin/ddptrain" --device cuda --precision "$prec" --data-dir .deps/fashion-mnist \
      --metrics "$out/fashion-$prec.jsonl" > "$out/fashion-$prec.log" 2>&1
    note "fashion-mnist 1 GPU $prec: $(grep -E 'test accuracy' "$out/fashion-$prec.log" | sed 's/.*info: //')"
    grep -q 'test accuracy' "$out/fashion-$prec.log" || fail fashion "$prec: no result"
  done
  grep -E 'bound|memory at|fused' "$out/fashion-fp32.log"
fi

if want monitor; then
  # The GPU monitor on Fashion-MNIST, alone and with two ranks sharing the GPU, and its cost:
  # bench-vs-torch tiny with and without it, alternating, in this one run.
  timeout 120 "$build/bin/ddptrain" --device cuda --epochs 3 --log-every 500 \
    --data-dir .deps/fashion-mnist --metrics "$out/monitor.jsonl" > "$out/monitor.log" 2>&1
  grep -E 'gpu monitor|step 1500/|GPUs over|  +(rank|[0-9]+ ) |test accuracy' "$out/monitor.log" | sed 's/.*info: //'
  grep -q 'GPUs over the run' "$out/monitor.log" || fail monitor "no GPU table at the end (1 rank)"
  note "monitor 1 rank: $(grep -A2 'GPUs over the run' "$out/monitor.log" | tail -1 | sed 's/.*info: *//')"
  timeout 200 "$build/bin/ddprun" --share-gpu --nproc-per-node 2 -- "$build/bin/ddptrain" --device cuda \
    --epochs 1 --log-every 200 --data-dir .deps/fashion-mnist > "$out/monitor2.log" 2>&1
  grep -A3 'GPUs over the run' "$out/monitor2.log" | sed 's/.*info: //'
  [ "$(grep -A3 'GPUs over the run' "$out/monitor2.log" | grep -cE 'info: +[01] ')" -eq 2 ] ||
    fail monitor "not both ranks in the GPU table"
  for round in 1 2; do
    for flags in "--no-gpu-monitor" ""; do
      rate="$(DDP_BENCH_FLAGS="$flags" TORCH_MODES="" timeout 120 scripts/bench-vs-torch.sh "$build" tiny:tf32 tiny:bf16 2>&1 |
        awk -F'|' '/^\| tiny/ { printf "%s %s ddp %s torch %s; ", $2, $3, $6, $7 }')"
      note "monitor cost round $round ${flags:-(monitor on)}: $rate"
    done
  done
fi

if want options; then
  for flags in "" "--no-cuda-graph" "--no-fused-epilogues" "--sync-debug" "--precision bf16" "--stage-from-host"; do
    timeout 120 "$build/bin/ddptrain" --device cuda --epochs 2 --data-dir .deps/fashion-mnist $flags > "$out/opt.log" 2>&1
    note "fashion 2 epochs ${flags:-(defaults)}: $(grep -E 'test accuracy' "$out/opt.log" | sed 's/.*info: //')"
    grep -q 'test accuracy' "$out/opt.log" || fail options "${flags:-(defaults)}: no result"
  done
fi

if want ddp1; then
  # The data-parallel GPU path (NCCL, buckets, events) on one GPU against the plain path:
  # with one rank the average is the identity, so the weights must match bitwise.
  args=(--device cuda --data synthetic --layers 64,256,128,10 --synthetic-samples 4096 --batch-size 128
        --steps 40 --log-every 10 --quiet)
  timeout 120 "$build/bin/ddptrain" "${args[@]}" --save-weights "$out/plain.safetensors" > "$out/ddp1.log" 2>&1
  timeout 120 "$build/bin/ddprun" --nproc-per-node 1 -- "$build/bin/ddptrain" "${args[@]}" --backend nccl \
    --bucket-mb 0.05 --first-bucket-mb 0.01 --save-weights "$out/nccl.safetensors" >> "$out/ddp1.log" 2>&1
  if cmp -s "$out/plain.safetensors" "$out/nccl.safetensors"; then same=bitwise-equal; else same=DIFFERENT; fi
  note "ddp path on 1 GPU (nccl, 4 buckets) vs plain path after 40 steps: $same"
  [ "$same" = bitwise-equal ] || fail ddp1 "the NCCL path differs from the plain path"
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddp_collectives_check" nccl all > "$out/nccl1.log" 2>&1
  note "nccl collectives, 1 rank: $(grep -c 'collectives ok: nccl' "$out/nccl1.log") ok, $(grep -c MISMATCH "$out/nccl1.log") mismatches"
  grep -q 'collectives ok: nccl' "$out/nccl1.log" || fail ddp1 "nccl collectives with 1 rank"
  grep -E 'error|MISMATCH' "$out/nccl1.log" | head -5
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" --device cuda --backend nccl \
    --data-dir .deps/fashion-mnist > "$out/fashion-ddp.log" 2>&1
  note "fashion-mnist via ddprun + nccl on 1 GPU: $(grep -E 'test accuracy' "$out/fashion-ddp.log" | sed 's/.*info: //'); $(grep -E 'first step' "$out/fashion-ddp.log" | sed 's/.*info: //')"
fi

if want multi; then
  # Needs two or more GPUs (nvidia-h200-x2): NCCL collectives, a rank that never calls,
  # MPI bootstrap, the collective bandwidth, data-parallel equivalence and Fashion-MNIST.
  timeout 200 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddp_collectives_check" nccl all > "$out/nccl.log" 2>&1
  note "nccl collectives over $(nvidia-smi -L | wc -l) GPUs: $(grep -c 'collectives ok: nccl' "$out/nccl.log") ranks ok, $(grep -c MISMATCH "$out/nccl.log") mismatches"
  [ "$(grep -c 'collectives ok: nccl' "$out/nccl.log")" -eq "$(nvidia-smi -L | wc -l)" ] || fail multi "nccl collectives"
  timeout 100 "$build/bin/ddprun" --nproc-per-node gpu --grace-period 2 -- "$build/bin/ddp_collectives_check" nccl straggler > "$out/nccl-straggler.log" 2>&1
  note "nccl straggler: $(grep -o 'all_reduce #1.*never reached it' "$out/nccl-straggler.log" | head -1)"
  grep -q 'rank(s) 1 never reached it' "$out/nccl-straggler.log" || fail multi "straggler not named"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 200 mpirun --oversubscribe -np 2 \
    "$build/bin/ddp_collectives_check" nccl all > "$out/nccl-mpi.log" 2>&1
  note "nccl under mpirun (id through MPI): $(grep -c 'collectives ok: nccl' "$out/nccl-mpi.log") ranks ok"
  [ "$(grep -c 'collectives ok: nccl' "$out/nccl-mpi.log")" -eq 2 ] || fail multi "nccl under mpirun"
  for op in all_reduce sendrecv; do
    timeout 300 "$build/bin/ddprun" --nproc-per-node gpu --quiet -- "$build/bin/ddpbench" collectives --device cuda \
      --op "$op" --min-bytes 8 --max-bytes 536870912 --factor 4 --iters 20 --warmup 5 > "$out/bench-$op.txt" 2>&1
    cat "$out/bench-$op.txt"
  done
  args=(--device cuda --data synthetic --layers 64,256,128,10 --synthetic-samples 4096 --batch-size 128
        --steps 40 --log-every 10 --quiet)
  timeout 120 "$build/bin/ddptrain" "${args[@]}" --save-weights "$out/one.safetensors" > "$out/dp.log" 2>&1
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" "${args[@]}" \
    --bucket-mb 0.05 --first-bucket-mb 0.01 --save-weights "$out/dp.safetensors" >> "$out/dp.log" 2>&1
  error="$("${PYTHON:-python3}" - "$out/one.safetensors" "$out/dp.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
print("%.2e" % max(abs(a[k] - b[k]).max() / abs(a[k]).max() for k in a))
PY
)"
  note "data parallel over GPUs vs one GPU after 40 steps (fp32): max relative error ${error:-none}"
  awk -v e="${error:-1}" 'BEGIN { exit !(e <= 1e-5) }' || fail multi "data parallel differs from one GPU"
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" --device cuda \
    --data-dir .deps/fashion-mnist > "$out/fashion-multi.log" 2>&1
  note "fashion-mnist over every GPU: $(grep -E 'test accuracy' "$out/fashion-multi.log" | sed 's/.*info: //'); $(grep -E 'first step' "$out/fashion-multi.log" | sed 's/.*info: //')"
  accuracy="$(grep -oE 'test accuracy [0-9.]+' "$out/fashion-multi.log" | awk '{print $3}')"
  awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 89.5) }' || fail multi "fashion-mnist over every GPU: ${accuracy:-no result}"
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" --device cuda --grad-reduce bf16 \
    --data-dir .deps/fashion-mnist > "$out/fashion-multi-bf16.log" 2>&1
  note "fashion-mnist over every GPU, --grad-reduce bf16: $(grep -E 'test accuracy' "$out/fashion-multi-bf16.log" | sed 's/.*info: //')"
  accuracy="$(grep -oE 'test accuracy [0-9.]+' "$out/fashion-multi-bf16.log" | awk '{print $3}')"
  awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 89.5) }' || fail multi "fashion-mnist, --grad-reduce bf16: ${accuracy:-no result}"
fi

if want bench-ddp; then
  # Needs two or more GPUs: ddprun against torchrun + PyTorch DDP (long: up to ~10 min).
  timeout 330 scripts/bench-ddp.sh "$build" > "$out/bench-ddp.md" 2> "$out/bench-ddp.err" ||
    fail bench-ddp "bench-ddp.sh exited $?"
  cat "$out/bench-ddp.md"
fi

for section in libtorch libtorch-shapes; do
  want "$section" || continue
  # LibTorch's DistributedDataParallel on one rank against plain LibTorch and PyTorch's DDP
  # (needs the build's torch component: the pip wheel's LibTorch; `torch` builds it), fp32 and
  # bf16: the example's CNN and the MLP, or ResNet-18 and the transformer blocks.
  models=cnn,mlp
  [ "$section" = libtorch-shapes ] && models=resnet,transformer
  if [ -x "$build/bin/ddp_torch_bench" ]; then
    timeout 500 scripts/bench-libtorch.sh "$build" --reps 10 --models $models > "$out/$section.log" 2>&1 ||
      fail "$section" "bench-libtorch.sh exited $? ($(tail -1 "$out/$section.log"))"
    grep '^|' "$out/$section.log"
  else
    fail "$section" "$build/bin/ddp_torch_bench not built (no LibTorch found at configure time; run the torch section first)"
  fi
done

if want libtorch-ranks; then
  # LibTorch's DistributedDataParallel one rank a GPU against PyTorch's DDP under torchrun (the
  # CNN and the MLP): plain, ZeRO 1-3, the bf16 and PowerSGD hooks (after `torch` or `build`).
  if [ -x "$build/bin/ddp_torch_bench" ]; then
    timeout 500 scripts/bench-libtorch-ranks.sh "$build" --models cnn,mlp > "$out/libtorch-ranks.log" 2>&1 ||
      fail libtorch-ranks "bench-libtorch-ranks.sh exited $? ($(tail -1 "$out/libtorch-ranks.log"))"
    grep -E '^\||^\(' "$out/libtorch-ranks.log"
    # The shard units against FSDP2 on the 1 B-parameter model, a rank a GPU: peak and step time.
    SHARE=0 RANKS="$(nvidia-smi -L | wc -l)" ROWS="plain units units-bf16 fsdp2 fsdp2-bf16" timeout 200 \
      scripts/bench-units-memory.sh "$build" > "$out/units.md" 2>&1 || fail libtorch-ranks "bench-units-memory.sh exited $?"
    cat "$out/units.md"
  else
    fail libtorch-ranks "$build/bin/ddp_torch_bench not built (run the torch section first)"
  fi
fi

if want pipeline; then
  # pp 2 on large across two GPUs: equality with one GPU, step time against the ideal,
  # timelines (kept in $OUT for scripts/plot_timeline.py). About 3.5 minutes. Then every
  # schedule's step against the simulator's from the measured costs (about 1.5 minutes).
  timeout 300 scripts/bench-pipeline.sh "$build" "$dest" > "$out/pipeline.md" 2> "$out/pipeline.err" ||
    fail pipeline "bench-pipeline.sh exited $? ($(tail -1 "$out/pipeline.err"))"
  cat "$out/pipeline.md"
  DEVICE=cuda timeout 200 scripts/bench-schedules.sh "$build" 3 > "$out/schedules.md" 2> "$out/schedules.err" ||
    fail pipeline "bench-schedules.sh exited $? ($(tail -1 "$out/schedules.err"))"
  cat "$out/schedules.md"
fi

if want zero; then
  # ZeRO 0-3 at dp = every GPU on large with AdamW: memory by kind and steady samples/s against
  # --zero 0's (issue 76: within 3 % for levels 1-2, 10 % for 3).
  STEPS=30 timeout 400 scripts/bench-zero-memory.sh "$build" "$(nvidia-smi -L | wc -l)" > "$out/zero.md" 2> "$out/zero.err" ||
    fail zero "bench-zero-memory.sh exited $? ($(tail -1 "$out/zero.err"))"
  cat "$out/zero.md"
fi

if want collectives; then
  # ddpbench against nccl-tests built from source here, in this one run.
  timeout 400 scripts/bench-collectives.sh "$build" > "$out/collectives.md" 2> "$out/collectives.err" ||
    fail collectives "bench-collectives.sh exited $? ($(tail -1 "$out/collectives.err"))"
  cat "$out/collectives.md"
fi

if want levers; then
  # Speed levers one at a time on every GPU, in this one run: medium and large, the defaults
  # against the overlapped optimizer, --grad-reduce bf16, fewer NCCL channels, NCCL's
  # symmetric windows (--nccl-symmetric, alone and with bf16), NCCL's efficiency CTA policy
  # (fewer SMs for its kernels) and the products leaving 16 SMs free; steady samples/s and
  # launch to first step (with the start-up lines of the default run). --nccl-symmetric's
  # weights must be the defaults' bit for bit (a power-of-two world: its sum then scaling is
  # the average), and the bf16 pair's likewise.
  source scripts/workloads.sh
  gpus="$(nvidia-smi -L | wc -l)"
  sms="$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)' 2>/dev/null || echo 0)"
  for run in medium:tf32 large:tf32 medium:bf16; do
    ddp_workload "${run%%:*}"
    prec="${run##*:}"
    for variant in default overlap-optimizer grad-bf16 nccl-8-channels nccl-symmetric \
      nccl-symmetric-grad-bf16 nccl-cta-efficiency product-sms; do
      vars=()
      flags=()
      [ "$variant" = overlap-optimizer ] && flags=(--overlap-optimizer)
      [ "$variant" = grad-bf16 ] && flags=(--grad-reduce bf16)
      [ "$variant" = nccl-8-channels ] && vars=(NCCL_MAX_NCHANNELS=8)
      [ "$variant" = nccl-symmetric ] && flags=(--nccl-symmetric)
      [ "$variant" = nccl-symmetric-grad-bf16 ] && flags=(--nccl-symmetric --grad-reduce bf16)
      [ "$variant" = nccl-cta-efficiency ] && vars=(NCCL_CTA_POLICY=1)
      if [ "$variant" = product-sms ]; then
        [ "$sms" -gt 16 ] || { note "lever $run product-sms: skipped (the SM count is unknown)"; continue; }
        flags=(--product-sms $((sms - 16)))
      fi
      rm -f "$out/lever.jsonl"
      env "${vars[@]}" timeout 200 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" --device cuda \
        --precision "$prec" --data synthetic --layers "$layers" --steps "$steps" --log-every $((steps / 6)) \
        --lr-schedule constant --lr 0.01 --autotune --batch-size $((batch * gpus)) \
        --synthetic-samples $((batch * gpus * 4)) --metrics "$out/lever.jsonl" "${flags[@]}" \
        --save-weights "$out/lever-weights-$variant.bin" \
        > "$out/lever-${run/:/-}-$variant.log" 2>&1 || fail levers "$run $variant exited $?"
      note "lever $run $variant: $(ddp_json "$out/lever.jsonl" steady_samples_per_s 2>/dev/null | cut -d. -f1) samples/s, first step $(ddp_json "$out/lever.jsonl" since_launch_s 2>/dev/null | cut -c1-5) s"
    done
    for pair in default:nccl-symmetric grad-bf16:nccl-symmetric-grad-bf16; do
      if cmp -s "$out/lever-weights-${pair%%:*}.bin" "$out/lever-weights-${pair##*:}.bin"; then
        note "lever $run ${pair##*:}: the weights of ${pair%%:*} bit for bit"
      else
        fail levers "$run ${pair##*:}: the weights differ from ${pair%%:*}'s"
      fi
    done
    grep -h 'symmetric windows' "$out/lever-${run/:/-}-nccl-symmetric.log" | head -1 | sed 's/.*info: /  /'
    grep -E 'driver init|ready .* after its start|loaded |model ready|first step finished' "$out/lever-${run/:/-}-default.log" |
      grep -v 'rank 1\]' | sed 's/.*info: /  /'
    # Where the time goes: one GPU alone, and one GPU while the other trains the same at once
    # (power, clocks and host shared, no communication).
    args=(--device cuda --precision "$prec" --data synthetic --layers "$layers" --steps "$steps"
          --log-every $((steps / 6)) --lr-schedule constant --lr 0.01 --autotune --batch-size "$batch"
          --synthetic-samples $((batch * 4)) --quiet)
    CUDA_VISIBLE_DEVICES=0 timeout 200 "$build/bin/ddptrain" "${args[@]}" --metrics "$out/alone.jsonl" > /dev/null 2>&1
    CUDA_VISIBLE_DEVICES=1 timeout 200 "$build/bin/ddptrain" "${args[@]}" --metrics "$out/other.jsonl" > /dev/null 2>&1 &
    CUDA_VISIBLE_DEVICES=0 timeout 200 "$build/bin/ddptrain" "${args[@]}" --metrics "$out/both.jsonl" > /dev/null 2>&1
    wait
    note "lever $run one GPU alone: $(ddp_json "$out/alone.jsonl" steady_samples_per_s 2>/dev/null | cut -d. -f1) samples/s; while the other GPU trains too: $(ddp_json "$out/both.jsonl" steady_samples_per_s 2>/dev/null | cut -d. -f1) and $(ddp_json "$out/other.jsonl" steady_samples_per_s 2>/dev/null | cut -d. -f1)"
  done
fi

if want bench-warm; then
  # torch.compile's autotuned kernels and ddptrain's autotune choices, kept in the build folder
  # (which stays between calls on a warm machine) so that `bench` fits in the next call.
  # About 450 s: torch.compile on tiny and medium (80 to 160 s a precision), not on large.
  if timeout 590 scripts/bench-vs-torch.sh --warm "$build" > "$out/bench-warm.log" 2>&1; then
    note "bench-warm: $(grep -c '^warmed' "$out/bench-warm.log") workloads warmed ($(grep '^warmed' "$out/bench-warm.log" | sed 's/^warmed //' | paste -sd, -))"
  else
    rc=$?
    tail -5 "$out/bench-warm.log"
    fail bench-warm "bench-vs-torch.sh --warm exited $rc ($(tail -1 "$out/bench-warm.log"))"
  fi
fi

if want bench; then
  # PyTorch eager, at its best (the step in a CUDA graph) and compiled; the limit.
  timeout 520 scripts/bench-vs-torch.sh "$build" > "$out/bench.md" 2> "$out/bench.err" ||
    fail bench "bench-vs-torch.sh exited $? ($(tail -1 "$out/bench.err"))"
  cat "$out/bench.md"
  note "bench: see bench.md"
fi

if want profile; then
  # Issues 33 and 46: where medium's and large's steps go beside PyTorch's best (Nsight Compute where
  # found, else Nsight Systems; kernels by kind a step).
  if timeout 590 scripts/profile-step.sh "$build" > "$out/profile.md" 2> "$out/profile.err"; then
    note "profile: see profile.md ($(grep -c '^### ' "$out/profile.md") workloads)"
  else
    rc=$?
    [ "$rc" = 77 ] && note "profile: skipped ($(tail -1 "$out/profile.md"))" ||
      fail profile "profile-step.sh exited $rc ($(tail -1 "$out/profile.md"))"
  fi
  cat "$out/profile.md"
fi

if want fused; then
  # Issue 33: the fused step against the usual one (tiny, each precision, with each phase's
  # time from the kernel's own stamps), and what leaving
  # SMs to the overlapped optimizer costs and gains (medium and large in bf16).
  timeout 120 "$build/bin/ddp_fused_mlp_bench" --trace > "$out/fused.md" 2> "$out/fused.err" ||
    fail fused "ddp_fused_mlp_bench exited $? ($(tail -1 "$out/fused.err"))"
  cat "$out/fused.md"
  timeout 300 scripts/bench-product-sms.sh "$build" > "$out/product-sms.md" 2> "$out/product-sms.err" ||
    fail fused "bench-product-sms.sh exited $? ($(tail -1 "$out/product-sms.err"))"
  cat "$out/product-sms.md"
  note "fused: see fused.md and product-sms.md"
fi

echo
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED sections: ${failed[*]}"
  exit 1
fi
