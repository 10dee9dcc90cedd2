#include "models/device_parameters.h"

#include "models/cuda_kernels.h"
#include "runtime/cuda_check.h"

namespace ddp {

DeviceParameters::DeviceParameters(size_t count, bool bf16, const OptimizerConfig& optimizer,
                                   cudaStream_t stream)
    : stream_(stream),
      params_(count, MemoryCategory::kParameters),
      grads_(count, MemoryCategory::kGradients),
      optimizer_(std::make_unique<DeviceOptimizer>(optimizer, count, stream)) {
  if (bf16) params16_ = DeviceBuffer<uint16_t>(count, MemoryCategory::kParameters);
}

void DeviceParameters::set(const float* host) {
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(params_.data(), host, params_.bytes(), cudaMemcpyHostToDevice, stream_));
  refresh_low_precision();
}

void DeviceParameters::get(float* host) const {
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host, params_.data(), params_.bytes(), cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::get_grads(float* host) const {
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host, grads_.data(), grads_.bytes(), cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::refresh_low_precision() {
  if (bf16()) launch_to_bf16(params_.data(), params16_.data(), params_.count(), stream_);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::update(size_t offset, size_t count, const OptStep* steps, const int* counter,
                              cudaStream_t stream) {
  optimizer_->update(params_.data(), grads_.data(), bf16() ? params16_.data() : nullptr, offset,
                     count, steps, counter, stream);
}

std::vector<std::pair<std::string, std::vector<float>>> DeviceParameters::optimizer_state() const {
  return optimizer_->state(stream_);
}

void DeviceParameters::set_optimizer_state(
    const std::vector<std::pair<std::string, std::vector<float>>>& state) {
  optimizer_->set_state(state, stream_);
}

}  // namespace ddp
