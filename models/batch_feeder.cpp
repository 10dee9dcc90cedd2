#include "models/batch_feeder.h"

#include <cstring>

#include "models/cuda_kernels.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

void DeviceSplit::upload(const Split& split, bool features, bool labels, cudaStream_t stream) {
  n = split.n;
  x = {};
  y = {};
  if (features && split.n > 0) {
    x = DeviceBuffer<float>(split.x.size(), MemoryCategory::kData);
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(x.data(), split.x.data(), x.bytes(), cudaMemcpyHostToDevice, stream));
  }
  if (labels && split.n > 0) {
    y = DeviceBuffer<int32_t>(split.y.size(), MemoryCategory::kData);
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(y.data(), split.y.data(), y.bytes(), cudaMemcpyHostToDevice, stream));
  }
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

BatchFeeder::BatchFeeder(int batch, int micro_batches, int max_steps, cudaStream_t stream)
    : batch_(batch), micro_batches_(micro_batches), max_steps_(max_steps), stream_(stream) {
  DDP_CHECK(batch >= 1 && micro_batches >= 1 && max_steps >= 1,
            "feeder of {} steps of {} x {} samples", max_steps, micro_batches, batch);
  const size_t per_step = static_cast<size_t>(micro_batches) * batch;
  indices_ = DeviceBuffer<int32_t>(per_step * max_steps, MemoryCategory::kOther);
  steps_ = DeviceBuffer<OptStep>(max_steps, MemoryCategory::kOther);
  pinned_indices_ = PinnedBuffer<int32_t>(indices_.count());
  pinned_steps_ = PinnedBuffer<OptStep>(steps_.count());
  counter_ = DeviceBuffer<int>(1, MemoryCategory::kOther);
  DDP_CUDA_CHECK(cudaMemsetAsync(counter_.data(), 0, sizeof(int), stream_));
}

void BatchFeeder::set_train_data(const Split& split, bool features, bool labels) {
  train_.upload(split, features, labels, stream_);
}

void BatchFeeder::set_train_data_host(const Split& split) {
  DDP_CHECK(micro_batches_ == 1, "host staging takes one batch a step, not {}", micro_batches_);
  host_split_ = &split;
  const size_t in_count = static_cast<size_t>(batch_) * split.dim;
  copy_stream_ = std::make_unique<CudaStream>();
  for (int slot = 0; slot < 2; ++slot) {
    staged_x_host_[slot] = PinnedBuffer<float>(in_count);
    staged_y_host_[slot] = PinnedBuffer<int32_t>(batch_);
    staged_x_[slot] = DeviceBuffer<float>(in_count, MemoryCategory::kData);
    staged_y_[slot] = DeviceBuffer<int32_t>(batch_, MemoryCategory::kData);
    copied_[slot] = std::make_unique<CudaEvent>();
    consumed_[slot] = std::make_unique<CudaEvent>();
  }
}

void BatchFeeder::stage_batch(const int32_t* indices) {
  DDP_CHECK(host_split_ != nullptr, "stage_batch() needs set_train_data_host()");
  DDP_CHECK(staged_ - fed_ < 2, "two batches are staged already");
  const int slot = static_cast<int>(staged_ % 2);
  // The pinned slot is free once its previous copy has finished.
  if (staged_ >= 2) DDP_CUDA_CHECK(cudaEventSynchronize(copied_[slot]->get()));
  const int dim = host_split_->dim;
  float* x = staged_x_host_[slot].data();
  int32_t* y = staged_y_host_[slot].data();
  for (int i = 0; i < batch_; ++i) {
    std::memcpy(x + static_cast<size_t>(i) * dim,
                host_split_->x.data() + static_cast<size_t>(indices[i]) * dim, sizeof(float) * dim);
    y[i] = host_split_->y[indices[i]];
  }
  cudaStream_t copy = copy_stream_->get();
  // The device slot is free once the step that used it has read it.
  if (staged_ >= 2) DDP_CUDA_CHECK(cudaStreamWaitEvent(copy, consumed_[slot]->get(), 0));
  DDP_CUDA_CHECK(cudaMemcpyAsync(staged_x_[slot].data(), x, staged_x_[slot].bytes(),
                                 cudaMemcpyHostToDevice, copy));
  DDP_CUDA_CHECK(cudaMemcpyAsync(staged_y_[slot].data(), y, staged_y_[slot].bytes(),
                                 cudaMemcpyHostToDevice, copy));
  DDP_CUDA_CHECK(cudaEventRecord(copied_[slot]->get(), copy));
  ++staged_;
}

void BatchFeeder::upload_schedule(const int32_t* indices, const OptStep* steps, int num_steps) {
  DDP_CHECK(num_steps >= 1 && num_steps <= max_steps_, "schedule chunk of {} steps", num_steps);
  // The previous chunk's steps must have read the pinned buffers before they are rewritten.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const size_t count = static_cast<size_t>(num_steps) * micro_batches_ * batch_;
  std::memcpy(pinned_indices_.data(), indices, sizeof(int32_t) * count);
  std::memcpy(pinned_steps_.data(), steps, sizeof(OptStep) * num_steps);
  DDP_CUDA_CHECK(cudaMemcpyAsync(indices_.data(), pinned_indices_.data(), sizeof(int32_t) * count,
                                 cudaMemcpyHostToDevice, stream_));
  DDP_CUDA_CHECK(cudaMemcpyAsync(steps_.data(), pinned_steps_.data(), sizeof(OptStep) * num_steps,
                                 cudaMemcpyHostToDevice, stream_));
  DDP_CUDA_CHECK(cudaMemsetAsync(counter_.data(), 0, sizeof(int), stream_));
}

void BatchFeeder::feed(CudaStage& stage, int micro, int slot) {
  DDP_CHECK(micro >= 0 && micro < micro_batches_, "micro-batch {} of {}", micro, micro_batches_);
  if (host_split_ == nullptr) {
    DDP_CHECK(train_.n > 0, "set_train_data() must come before training");
    stage.gather(train_.x.data(), train_.y.data(), stage.shape().input_width(),
                 indices_.data() + static_cast<size_t>(micro) * batch_, counter_.data(),
                 micro_batches_ * batch_, batch_, slot);
    return;
  }
  DDP_CHECK(fed_ < staged_, "step {} has no staged batch: call stage_batch() first", fed_);
  const int staged = static_cast<int>(fed_ % 2);
  DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, copied_[staged]->get(), 0));
  stage.set_input(staged_x_[staged].data(), batch_, slot);
  stage.set_labels(staged_y_[staged].data(), batch_, slot);
  DDP_CUDA_CHECK(cudaEventRecord(consumed_[staged]->get(), stream_));
  ++fed_;
}

void BatchFeeder::next_step() {
  launch_increment(counter_.data(), stream_);
}

}  // namespace ddp
