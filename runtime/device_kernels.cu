// The first kernel of a worker: proves that the binary has code for this device and times
// the first launch.
#include "runtime/cuda_check.h"
#include "runtime/device_kernels.h"

namespace ddp {
namespace {
__global__ void touch_kernel(int* out) {
  *out = 42;
}
}  // namespace

void launch_touch_kernel(int* device_out, cudaStream_t stream) {
  touch_kernel<<<1, 1, 0, stream>>>(device_out);
  DDP_CUDA_CHECK_LAUNCH();
}
}  // namespace ddp
