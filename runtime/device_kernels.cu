// The first kernel of a worker: proves that the binary has code for this device and times
// the first launch.
#include <cuda_bf16.h>

#include <algorithm>

#include "runtime/cuda_check.h"
#include "runtime/device_kernels.h"

namespace ddp {
namespace {
__global__ void touch_kernel(int* out) {
  *out = 42;
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void from_bf16_kernel(const __nv_bfloat16* in, float* out, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]) * scale;
}

template <typename T>
__global__ void scale_kernel(T* data, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    data[i] = static_cast<T>(static_cast<float>(data[i]) * scale);
}

// Enough blocks to fill the GPU with grid-stride loops, never more than the work needs.
unsigned blocks_for(size_t n) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>((n + 255) / 256, 2048)));
}
}  // namespace

void launch_float_to_bf16(const float* in, void* out, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  to_bf16_kernel<<<blocks_for(count), 256, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out),
                                                        count);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_bf16_to_float(const void* in, float* out, size_t count, cudaStream_t stream,
                          float scale) {
  if (count == 0) return;
  from_bf16_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(in),
                                                          out, count, scale);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_scale(void* data, bool bf16, size_t count, float scale, cudaStream_t stream) {
  if (count == 0) return;
  if (bf16)
    scale_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count,
                                                        scale);
  else
    scale_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<float*>(data), count, scale);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_touch_kernel(int* device_out, cudaStream_t stream) {
  touch_kernel<<<1, 1, 0, stream>>>(device_out);
  DDP_CUDA_CHECK_LAUNCH();
}
}  // namespace ddp
