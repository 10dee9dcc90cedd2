// Host launchers of the runtime's own kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ddp {
// Writes 42 to *device_out on `stream`. Asynchronous; checks the launch error.
void launch_touch_kernel(int* device_out, cudaStream_t stream);
// out[i] = in[i] rounded to bfloat16 (to nearest even); out holds count bf16 values.
void launch_float_to_bf16(const float* in, void* out, size_t count, cudaStream_t stream);
// out[i] = the bfloat16 in[i] as float (exact), times `scale` (1: exact; a power of two: exact
// too, barring subnormals).
void launch_bf16_to_float(const void* in, float* out, size_t count, cudaStream_t stream,
                          float scale = 1.0f);
// data[i] *= scale in place, `count` float32 (or, `bf16`, bfloat16) values, rounded to their
// type.
void launch_scale(void* data, bool bf16, size_t count, float scale, cudaStream_t stream);
}  // namespace ddp
