// DeviceOptimizer: the state's buffers and the update kernels' launches.
#include "models/optimizer_cuda.h"

#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

DeviceOptimizer::DeviceOptimizer(const OptimizerConfig& config, size_t count, cudaStream_t stream)
    : config_(config), count_(count) {
  if (config.kind == OptimizerKind::kAdamW) {
    first_ = DeviceBuffer<float>(count, MemoryCategory::kOptimizerState);
    second_ = DeviceBuffer<float>(count, MemoryCategory::kOptimizerState);
  } else if (config.momentum != 0.0f) {
    first_ = DeviceBuffer<float>(count, MemoryCategory::kOptimizerState);
  }
  for (DeviceBuffer<float>* buffer : {&first_, &second_})
    if (buffer->count() > 0)
      DDP_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->bytes(), stream));
}

void DeviceOptimizer::update(float* params, const float* grads, uint16_t* params16, size_t offset,
                             size_t count, const OptStep* steps, const int* counter,
                             cudaStream_t stream) {
  DDP_CHECK(offset + count <= count_, "optimizer update {}+{} past {} parameters", offset, count,
            count_);
  auto at = [offset](auto* base) { return base != nullptr ? base + offset : nullptr; };
  void* p16 = at(params16);
  if (config_.kind == OptimizerKind::kAdamW)
    launch_adamw(at(params), at(grads), at(first_.data()), at(second_.data()), p16, count, steps,
                 counter, config_.beta1, config_.beta2, config_.eps, config_.weight_decay, stream);
  else
    launch_sgd(at(params), at(grads), at(first_.data()), p16, count, steps, counter,
               config_.momentum, config_.weight_decay, stream);
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
