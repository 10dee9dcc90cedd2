#!/usr/bin/env bash
# Scratch: the torch component, FSDP2 beside ddp's units (memory), bench-schedules on the GPU.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDACXX=/usr/local/cuda/bin/nvcc
export DDP_BUILD_DIR=$PWD/build-gpu DDP_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$PWD/.deps/zlib;$PWD/.deps/json -DCMAKE_CUDA_ARCHITECTURES=90"
start=$(date +%s)
t() { echo "== $(( $(date +%s) - start ))s: $*"; }
(source scripts/deps.sh && ddp_configure) > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target ddptrain ddprun ddp_torch_unit_worker > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head; exit 1; }
t built
BLOCKS=4 DIM=256 UNIT=MB RANKS=2 ROWS="units fsdp2 fsdp2-bf16" timeout 120 scripts/bench-units-memory.sh build-gpu 2>&1 | tail -6
t small
DEVICE=cuda SHARE=1 timeout 200 scripts/bench-schedules.sh build-gpu 1 2>&1 | tail -9
t schedules
RANKS=2 ROWS="plain units units-bf16 fsdp2 fsdp2-bf16" timeout 200 scripts/bench-units-memory.sh build-gpu 2>&1 | tail -8
t big
