// What feeds a GPU stage (CudaStage) its samples and its optimizer's scalars: the training
// split on the device, or kept on the host and staged through pinned memory one batch ahead;
// a chunk of the schedule (each step's sample indices and optimizer scalars) uploaded at
// once; and the step counter that the gather and the optimizer read on the device, so that
// a step captured in a CUDA graph replays over the whole chunk without the host. The whole
// model's runner takes chunks of up to 512 steps; a pipeline stage's, one step.
// Only built with CUDA. All calls are on the stage's stream unless stated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "models/dataset.h"
#include "models/mlp_stage_cuda.h"
#include "models/optimizer.h"
#include "runtime/device_buffer.h"

namespace ddp {

// A split's features and labels on the device, each only where asked (synchronous).
struct DeviceSplit {
  DeviceBuffer<float> x;
  DeviceBuffer<int32_t> y;
  int64_t n = 0;
  void upload(const Split& split, bool features, bool labels, cudaStream_t stream);
};

class BatchFeeder {
 public:
  // Steps of `micro_batches` micro-batches of `batch` samples; chunks of at most `max_steps`.
  BatchFeeder(int batch, int micro_batches, int max_steps, cudaStream_t stream);
  BatchFeeder(const BatchFeeder&) = delete;
  BatchFeeder& operator=(const BatchFeeder&) = delete;

  // The training split on the device: its features where `features` (the first stage), its
  // labels where `labels` (the last).
  void set_train_data(const Split& split, bool features, bool labels);
  // For a training set too large for the device (one stage holding the whole model, one
  // micro-batch a step): `split` stays on the host (it must outlive the feeder); each batch is
  // gathered on the host into pinned memory and copied on a copy stream (stage_batch), and
  // steps must run without a graph.
  void set_train_data_host(const Split& split);
  bool host_staged() const { return host_split_ != nullptr; }
  // Host staging: gathers the batch of the next step to run (`batch` sample indices) and
  // starts its copy. Once before the first step and then once per step, for the step after
  // the one about to run; at most two batches are staged at a time.
  void stage_batch(const int32_t* indices);

  // The next chunk of the schedule: for each of `steps` steps, micro_batches x batch sample
  // indices (micro-batch k's after micro-batch k-1's) and the optimizer's scalars; the step
  // counter back to the chunk's first step. Waits for the stream (the previous chunk's steps
  // read the buffers it rewrites).
  void upload_schedule(const int32_t* indices, const OptStep* steps, int num_steps);
  // Micro-batch `micro` of the current step into `stage`'s slot: gathered on the device (the
  // features on the first stage, the labels on the last), or the staged batch.
  void feed(CudaStage& stage, int micro, int slot);
  // The current step's optimizer scalars, as CudaStage::optimizer_step reads them.
  const OptStep* steps() const { return steps_.data(); }
  const int* counter() const { return counter_.data(); }
  // After the step's optimizer: the counter moves on (stream-ordered, captured with the step).
  void next_step();
  int max_steps() const { return max_steps_; }
  // The device's copies the feeder reads (the fused step reads them itself): the training
  // split's features and labels (null where not uploaded) and the chunk's sample indices.
  const float* train_x() const { return train_.x.data(); }
  const int32_t* train_y() const { return train_.y.data(); }
  const int32_t* indices() const { return indices_.data(); }

 private:
  int batch_, micro_batches_, max_steps_;
  cudaStream_t stream_;
  DeviceSplit train_;
  DeviceBuffer<int32_t> indices_;
  DeviceBuffer<OptStep> steps_;
  PinnedBuffer<int32_t> pinned_indices_;
  PinnedBuffer<OptStep> pinned_steps_;
  DeviceBuffer<int> counter_;
  // Host staging: two slots of pinned and device buffers, the copy stream and its events.
  const Split* host_split_ = nullptr;
  PinnedBuffer<float> staged_x_host_[2];
  PinnedBuffer<int32_t> staged_y_host_[2];
  DeviceBuffer<float> staged_x_[2];
  DeviceBuffer<int32_t> staged_y_[2];
  std::unique_ptr<CudaStream> copy_stream_;
  std::unique_ptr<CudaEvent> copied_[2], consumed_[2];
  int64_t staged_ = 0;  // batches staged so far
  int64_t fed_ = 0;     // batches fed to steps
};

}  // namespace ddp
