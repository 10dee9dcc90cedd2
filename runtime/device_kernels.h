// Host launchers of the runtime's own kernels.
#pragma once

#include <cuda_runtime.h>

namespace ddp {
// Writes 42 to *device_out on `stream`. Asynchronous; checks the launch error.
void launch_touch_kernel(int* device_out, cudaStream_t stream);
}  // namespace ddp
