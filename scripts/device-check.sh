#!/usr/bin/env bash
# Everything that needs a GPU, in one call on the device machine: build (sm_90), the GPU
# tests, the launcher on every GPU, Fashion-MNIST on one GPU, the benchmarks. Logs go to
# $OUT (or ./device-out); a short table is printed last.
# Usage: scripts/device-check.sh [sections...]  sections: build doctor cuda cpu launcher fashion options ddp1 multi bench
# Expects .deps/ (made by scripts/device-prepare.sh here): fashion-mnist/, include/ for the
# headers the device image lacks.
set -uo pipefail
cd "$(dirname "$0")/.."
# Logs are kept in a work folder and packed into $OUT/logs.tgz at the end (the device tool
# brings back only a few files).
out="$(mktemp -d)"
dest="${OUT:-$PWD/device-out}"
mkdir -p "$dest"
trap 'tar -C "$out" -czf "$dest/logs.tgz" . 2>/dev/null' EXIT
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(build cuda cpu launcher fashion bench)
want() { local s; for s in "${sections[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
build=build-gpu
summary=()
note() { summary+=("$1"); echo "== $1"; }

if want build || [ ! -x "$build/bin/ddptrain" ]; then
  extra=()
  [ -f /usr/include/zlib.h ] || extra+=(-DZLIB_INCLUDE_DIR="$PWD/.deps/include"
    -DZLIB_LIBRARY="$(ls /usr/lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)")
  start=$(date +%s)
  if cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
       -DCMAKE_PREFIX_PATH="$PWD/.deps" "${extra[@]}" > "$out/configure.log" 2>&1 &&
     cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1; then
    note "build: ok in $(( $(date +%s) - start ))s ($(grep -E 'found:|left out:' "$out/configure.log" | tr -s ' ' | tr '\n' ';'))"
  else
    tail -30 "$out/configure.log" "$out/build.log"
    note "build: FAILED"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
fi

if want doctor; then
  "$build/bin/ddpdoctor" > "$out/doctor.log" 2>&1
  cat "$out/doctor.log"
  note "ddpdoctor: $(tail -1 "$out/doctor.log")"
fi

if want cuda; then
  (cd "$build" && ctest -L cuda --output-on-failure --timeout 300) > "$out/ctest-cuda.log" 2>&1
  note "cuda tests: $(grep -E 'tests passed|tests failed' "$out/ctest-cuda.log" | tail -1)"
  grep -E '\((Failed|Skipped)\)|Failure|error' "$out/ctest-cuda.log" | head -20
fi

if want cpu; then
  (cd "$build" && ctest -L 'unit|dist' --timeout 120 -j 8) > "$out/ctest-cpu.log" 2>&1
  note "cpu tests on the device: $(grep -E 'tests passed|tests failed' "$out/ctest-cpu.log" | tail -1)"
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
fi

if want fashion; then
  for prec in fp32 tf32; do
    timeout 120 "$build/bin/ddptrain" --device cuda --precision "$prec" --data-dir .deps/fashion-mnist \
      --metrics "$out/fashion-$prec.jsonl" > "$out/fashion-$prec.log" 2>&1
    note "fashion-mnist 1 GPU $prec: $(grep -E 'test accuracy' "$out/fashion-$prec.log" | sed 's/.*info: //')"
  done
  grep -E 'bound|memory at|fused' "$out/fashion-fp32.log"
fi

if want options; then
  for flags in "" "--no-cuda-graph" "--no-fused-epilogues" "--sync-debug" "--precision bf16" "--stage-from-host"; do
    timeout 120 "$build/bin/ddptrain" --device cuda --epochs 2 --data-dir .deps/fashion-mnist $flags > "$out/opt.log" 2>&1
    note "fashion 2 epochs ${flags:-(defaults)}: $(grep -E 'test accuracy' "$out/opt.log" | sed 's/.*info: //')"
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
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddp_collectives_check" nccl all > "$out/nccl1.log" 2>&1
  note "nccl collectives, 1 rank: $(grep -c 'collectives ok: nccl' "$out/nccl1.log") ok, $(grep -c MISMATCH "$out/nccl1.log") mismatches"
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
  timeout 100 "$build/bin/ddprun" --nproc-per-node gpu --grace-period 2 -- "$build/bin/ddp_collectives_check" nccl straggler > "$out/nccl-straggler.log" 2>&1
  note "nccl straggler: $(grep -o 'all_reduce #1.*never reached it' "$out/nccl-straggler.log" | head -1)"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 200 mpirun --oversubscribe -np 2 \
    "$build/bin/ddp_collectives_check" nccl all > "$out/nccl-mpi.log" 2>&1
  note "nccl under mpirun (id through MPI): $(grep -c 'collectives ok: nccl' "$out/nccl-mpi.log") ranks ok"
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
  note "data parallel over GPUs vs one GPU after 40 steps (fp32): $("${PYTHON:-python3}" - "$out/one.safetensors" "$out/dp.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
print("max relative error %.2e" % max(abs(a[k] - b[k]).max() / abs(a[k]).max() for k in a))
PY
)"
  timeout 120 "$build/bin/ddprun" --nproc-per-node gpu -- "$build/bin/ddptrain" --device cuda \
    --data-dir .deps/fashion-mnist > "$out/fashion-multi.log" 2>&1
  note "fashion-mnist over every GPU: $(grep -E 'test accuracy' "$out/fashion-multi.log" | sed 's/.*info: //'); $(grep -E 'first step' "$out/fashion-multi.log" | sed 's/.*info: //')"
  timeout 580 scripts/bench-ddp.sh "$build" > "$out/bench-ddp.md" 2> "$out/bench-ddp.err"
  cat "$out/bench-ddp.md"
fi

if want bench; then
  timeout 400 scripts/bench-vs-torch.sh "$build" > "$out/bench.md" 2> "$out/bench.err"
  cat "$out/bench.md"
  note "bench: see bench.md"
fi

echo
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
