// The optimizer on the GPU, its own part: its state (SGD's momentum; AdamW's two moments) in
// flat buffers laid out as the parameters', and the one-kernel update of any range of them
// (elementwise, so updating a buffer in parts gives bitwise the whole pass). Used by the
// whole model and by a pipeline stage (both a CudaStage). Only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "models/cuda_kernels.h"
#include "models/optimizer.h"
#include "runtime/device_buffer.h"

namespace ddp {

class DeviceOptimizer {
 public:
  // State for `count` parameters, zeroed on `stream`.
  DeviceOptimizer(const OptimizerConfig& config, size_t count, cudaStream_t stream);

  // `count` parameters from `params` (their gradients from `grads`, their bf16 copy from
  // `params16`, or null), whose state is the state's [state_offset, + count), updated with
  // the scalars steps[*counter] (counter null: steps[0]), on `stream`.
  void update(float* params, const float* grads, uint16_t* params16, size_t state_offset,
              size_t count, const OptStep* steps, const int* counter, cudaStream_t stream);
  // State for `count` parameters instead (--zero: a rank's shard), zeroed on `stream`.
  void resize(size_t count, cudaStream_t stream);
  size_t count() const { return count_; }
  // The state's device buffers by name (as state()'s).
  std::vector<std::pair<std::string, float*>> buffers() const;

  // Host copies for checkpoints: SGD "momentum" (none without momentum); AdamW "exp_avg",
  // "exp_avg_sq" (the CPU optimizer's names). Synchronous on `stream`.
  std::vector<std::pair<std::string, std::vector<float>>> state(cudaStream_t stream) const;
  void set_state(const std::vector<std::pair<std::string, std::vector<float>>>& state,
                 cudaStream_t stream);

 private:
  OptimizerConfig config_;
  size_t count_;
  DeviceBuffer<float> first_, second_;  // momentum or exp_avg; exp_avg_sq
};

}  // namespace ddp
