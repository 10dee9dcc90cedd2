// DeviceOptimizer: the state's buffers and the update kernels' launches.
#include "models/optimizer_cuda.h"

#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

DeviceOptimizer::DeviceOptimizer(const OptimizerConfig& config, size_t count, cudaStream_t stream)
    : config_(config) {
  resize(count, stream);
}

void DeviceOptimizer::resize(size_t count, cudaStream_t stream) {
  count_ = count;
  first_ = {};
  second_ = {};
  if (config_.kind == OptimizerKind::kAdamW) {
    first_ = DeviceBuffer<float>(count, MemoryCategory::kOptimizerState);
    second_ = DeviceBuffer<float>(count, MemoryCategory::kOptimizerState);
  } else if (config_.momentum != 0.0f) {
    first_ = DeviceBuffer<float>(count, MemoryCategory::kOptimizerState);
  }
  for (DeviceBuffer<float>* buffer : {&first_, &second_})
    if (buffer->count() > 0)
      DDP_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->bytes(), stream));
}

void DeviceOptimizer::update(float* params, const float* grads, uint16_t* params16,
                             size_t state_offset, size_t count, const OptStep* steps,
                             const int* counter, cudaStream_t stream) {
  DDP_CHECK(state_offset + count <= count_, "optimizer update {}+{} past {} parameters",
            state_offset, count, count_);
  auto state = [state_offset](float* base) {
    return base != nullptr ? base + state_offset : nullptr;
  };
  if (config_.kind == OptimizerKind::kAdamW)
    launch_adamw(params, grads, state(first_.data()), state(second_.data()), params16, count, steps,
                 counter, config_.beta1, config_.beta2, config_.eps, config_.weight_decay, stream);
  else
    launch_sgd(params, grads, state(first_.data()), params16, count, steps, counter,
               config_.momentum, config_.weight_decay, stream);
}

std::vector<std::pair<std::string, float*>> DeviceOptimizer::buffers() const {
  std::vector<std::pair<std::string, float*>> named;
  if (config_.kind == OptimizerKind::kAdamW) {
    named.emplace_back("exp_avg", first_.data());
    named.emplace_back("exp_avg_sq", second_.data());
  } else if (first_.count() > 0) {
    named.emplace_back("momentum", first_.data());
  }
  return named;
}

std::vector<std::pair<std::string, std::vector<float>>> DeviceOptimizer::state(
    cudaStream_t stream) const {
  std::vector<std::pair<std::string, std::vector<float>>> state;
  auto download = [&](const char* name, const DeviceBuffer<float>& buffer) {
    if (buffer.count() == 0) return;
    std::vector<float> values(buffer.count());
    DDP_CUDA_CHECK(cudaMemcpyAsync(values.data(), buffer.data(), buffer.bytes(),
                                   cudaMemcpyDeviceToHost, stream));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    state.emplace_back(name, std::move(values));
  };
  if (config_.kind == OptimizerKind::kAdamW) {
    download("exp_avg", first_);
    download("exp_avg_sq", second_);
  } else {
    download("momentum", first_);
  }
  return state;
}

void DeviceOptimizer::set_state(
    const std::vector<std::pair<std::string, std::vector<float>>>& state, cudaStream_t stream) {
  for (const auto& [name, values] : state) {
    const DeviceBuffer<float>* target = name == "exp_avg_sq" ? &second_ : &first_;
    DDP_CHECK(values.size() == target->count(), "optimizer state {} has {} values, expected {}",
              name, values.size(), target->count());
    DDP_CUDA_CHECK(cudaMemcpyAsync(target->data(), values.data(), target->bytes(),
                                   cudaMemcpyHostToDevice, stream));
  }
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace ddp
