// Host launchers of the runtime's own kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ddp {
// Writes 42 to *device_out on `stream`. Asynchronous; checks the launch error.
void launch_touch_kernel(int* device_out, cudaStream_t stream);
// out[i] = in[i] rounded to bfloat16 (to nearest even); out holds count bf16 values.
void launch_float_to_bf16(const float* in, void* out, size_t count, cudaStream_t stream);
// out[i] = the bfloat16 in[i] as float (exact).
void launch_bf16_to_float(const void* in, float* out, size_t count, cudaStream_t stream);
}  // namespace ddp
