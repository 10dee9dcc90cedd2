// The loss's sums on the GPU, their own part: the fused softmax cross-entropy
// (launch_softmax_xent) adds each batch's summed loss and hits to a pair of counters on the
// device; training and evaluation have a pair each, so evaluating never disturbs a training
// window, and the host takes (reads and zeroes) them when it needs them. Used by the whole
// model and by a pipeline's last stage (both a CudaStage). Only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include "models/cpu_ops.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace ddp {

class DeviceLossSums {
 public:
  enum Kind { kTraining = 0, kEvaluation = 1 };

  // Zeroed on `stream`, where every later call runs.
  explicit DeviceLossSums(cudaStream_t stream)
      : stream_(stream), loss_(2, MemoryCategory::kOther), correct_(2, MemoryCategory::kOther) {
    DDP_CUDA_CHECK(cudaMemsetAsync(loss_.data(), 0, loss_.bytes(), stream_));
    DDP_CUDA_CHECK(cudaMemsetAsync(correct_.data(), 0, correct_.bytes(), stream_));
  }
  // Where launch_softmax_xent adds a batch's loss sum and hits.
  double* loss(Kind kind) const { return loss_.data() + kind; }
  int* correct(Kind kind) const { return correct_.data() + kind; }
  // The sums since the last take of this kind, then zeroed (synchronises the stream).
  LossSum take(Kind kind) {
    LossSum sums;
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(&sums.loss, loss(kind), sizeof(double), cudaMemcpyDeviceToHost, stream_));
    DDP_CUDA_CHECK(cudaMemcpyAsync(&sums.correct, correct(kind), sizeof(int),
                                   cudaMemcpyDeviceToHost, stream_));
    DDP_CUDA_CHECK(cudaMemsetAsync(loss(kind), 0, sizeof(double), stream_));
    DDP_CUDA_CHECK(cudaMemsetAsync(correct(kind), 0, sizeof(int), stream_));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return sums;
  }

 private:
  cudaStream_t stream_;
  DeviceBuffer<double> loss_;
  DeviceBuffer<int> correct_;
};

}  // namespace ddp
