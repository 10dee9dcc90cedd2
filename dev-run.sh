#!/usr/bin/env bash
# Scratch: build the new tree and the old one, run the new GPU tests and a compare-builds subset.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDACXX=/usr/local/cuda/bin/nvcc
args="-DCMAKE_PREFIX_PATH=$PWD/.deps/zlib;$PWD/.deps/json -DCMAKE_CUDA_ARCHITECTURES=90"
start=$(date +%s)
t() { echo "== $(( $(date +%s) - start ))s: $*"; }
( export DDP_BUILD_DIR=$PWD/build-gpu DDP_CMAKE_ARGS="$args"; source scripts/deps.sh && ddp_configure ) > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
( cd .deps/old-src && export DDP_BUILD_DIR=$PWD/../old-build DDP_CMAKE_ARGS="$args"; source scripts/deps.sh && ddp_configure ) > $OUT/configure-old.log 2>&1 || { tail -20 $OUT/configure-old.log; exit 1; }
t configured
cmake --build build-gpu -j 10 --target ddptrain ddprun ddpbench ddp_cuda_dist_tests > $OUT/build.log 2>&1 &
cmake --build .deps/old-build -j 6 --target ddptrain ddprun > $OUT/build-old.log 2>&1 &
wait
grep -E "error" $OUT/build.log $OUT/build-old.log | head -20
t built
cd build-gpu
ctest -R "SymmetricWindows" --output-on-failure --timeout 300 > $OUT/sym.log 2>&1; tail -5 $OUT/sym.log; grep -E "Failure|Expected|Which is|error" $OUT/sym.log | head -20
t symmetric test
./bin/ddprun --share-gpu --nproc-per-node 2 --quiet -- ./bin/ddpbench collectives --device cuda --symmetric --max-bytes 16777216 --factor 16 2>&1 | tail -12
t ddpbench
cd ..
ONLY='^plain|^dp 2$|bf16|overlapped' scripts/compare-builds.sh .deps/old-build build-gpu $OUT/compare 2>&1 | tail -15
t compare
