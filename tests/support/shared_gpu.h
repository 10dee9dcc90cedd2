// How the multi-rank GPU tests start their jobs on one GPU: ddprun --share-gpu (each rank its
// own NCCL host, NCCL over sockets), NVLink multicast off in every process.
#pragma once

#include <string>

namespace ddp {

inline const std::string kGpuEnv =
    "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ";
inline const std::string kSharedGpu = kGpuEnv + DDPRUN_PATH + " --share-gpu";

}  // namespace ddp
