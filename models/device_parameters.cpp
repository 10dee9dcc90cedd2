#include "models/device_parameters.h"

#include "models/cuda_kernels.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

DeviceParameters::DeviceParameters(size_t count, bool bf16, const OptimizerConfig& optimizer,
                                   cudaStream_t stream, GradientRing ring)
    : stream_(stream),
      params_(count, MemoryCategory::kParameters),
      grads_(ring.slots > 0 ? 0 : count, MemoryCategory::kGradients),
      ring_(std::move(ring)),
      optimizer_(std::make_unique<DeviceOptimizer>(optimizer, count, stream)) {
  if (bf16) params16_ = DeviceBuffer<uint16_t>(count, MemoryCategory::kParameters);
  for (int s = 0; s < ring_.slots; ++s)
    ring_slots_.emplace_back(ring_.slot_floats, MemoryCategory::kGradients);
  for (size_t b = 0; b < ring_.buckets.size(); ++b)
    DDP_CHECK(ring_.buckets[b].second <= ring_.slot_floats &&
                  ring_.buckets[b].first + ring_.buckets[b].second <= count,
              "gradient ring: bucket {} ({}+{}) does not fit a slot of {} or the {} parameters", b,
              ring_.buckets[b].first, ring_.buckets[b].second, ring_.slot_floats, count);
}

float* DeviceParameters::grad_at(size_t offset) const {
  if (!ringed()) return grads_.data() + offset;
  for (size_t b = 0; b < ring_.buckets.size(); ++b) {
    const auto [first, count] = ring_.buckets[b];
    if (offset >= first && offset < first + count) return bucket_grads(b) + (offset - first);
  }
  DDP_CHECK(false, "gradient ring: element {} is in no bucket", offset);
  return nullptr;
}

float* DeviceParameters::bucket_grads(size_t bucket) const {
  DDP_CHECK(ringed() && bucket < ring_.buckets.size(), "gradient ring: no bucket {}", bucket);
  return ring_slots_[bucket % static_cast<size_t>(ring_.slots)].data();
}

void DeviceParameters::fill_grads(float value, cudaStream_t stream) {
  if (!ringed()) launch_fill(grads_.data(), grads_.count(), false, value, stream);
  for (DeviceBuffer<float>& slot : ring_slots_)
    launch_fill(slot.data(), slot.count(), false, value, stream);
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
  DDP_CHECK(!ringed(), "the gradients are in a ring of bucket slots (--zero 2), not one buffer");
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host, grads_.data(), grads_.bytes(), cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::refresh_low_precision() {
  to_low_precision(stream_);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::to_low_precision(cudaStream_t stream) {
  if (bf16()) launch_to_bf16(params_.data(), params16_.data(), params_.count(), stream);
}

void DeviceParameters::update(size_t offset, size_t count, const OptStep* steps, const int* counter,
                              cudaStream_t stream) {
  DDP_CHECK(!ringed(), "the whole-buffer update without the whole gradient buffer (a ring)");
  update_piece(offset, grads_.data() + offset, offset, count, steps, counter, stream);
}

void DeviceParameters::shard_optimizer(size_t count) {
  optimizer_->resize(count, stream_);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::update_piece(size_t offset, const float* grads, size_t state_offset,
                                    size_t count, const OptStep* steps, const int* counter,
                                    cudaStream_t stream) {
  DDP_CHECK(offset + count <= params_.count(), "optimizer update {}+{} past {} parameters", offset,
            count, params_.count());
  optimizer_->update(params_.data() + offset, grads, bf16() ? params16_.data() + offset : nullptr,
                     state_offset, count, steps, counter, stream);
}

std::vector<std::pair<std::string, std::vector<float>>> DeviceParameters::optimizer_state() const {
  return optimizer_->state(stream_);
}

void DeviceParameters::set_optimizer_state(
    const std::vector<std::pair<std::string, std::vector<float>>>& state) {
  optimizer_->set_state(state, stream_);
}

}  // namespace ddp
