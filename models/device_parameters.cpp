#include "models/device_parameters.h"

#include "models/cuda_kernels.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

DeviceParameters::DeviceParameters(size_t count, bool bf16, const OptimizerConfig& optimizer,
                                   cudaStream_t stream, GradientRing ring,
                                   const DeviceAllocator* grads_memory)
    : stream_(stream),
      count_(count),
      bf16_(bf16),
      params_(count, MemoryCategory::kParameters),
      grads_(ring.slots > 0 ? 0 : count, MemoryCategory::kGradients, grads_memory),
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

void* DeviceParameters::for_products(size_t offset) const {
  if (layers_placed()) {
    const auto [layer, at] = layer_of(offset);
    return bf16() ? static_cast<void*>(slots16_[layer % slots16_.size()].data() + at)
                  : static_cast<void*>(slots_[layer % slots_.size()].data() + at);
  }
  return bf16() ? static_cast<void*>(params16_.data() + offset)
                : static_cast<void*>(params_.data() + offset);
}

float* DeviceParameters::param_at(size_t offset) const {
  if (!layers_placed()) return params_.data() + offset;
  const auto [layer, at] = layer_of(offset);
  return slots_[layer % slots_.size()].data() + at;
}

std::pair<size_t, size_t> DeviceParameters::layer_of(size_t offset) const {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (offset >= layers_[i].first && offset < layers_[i].first + layers_[i].second)
      return {i, offset - layers_[i].first};
  DDP_CHECK(false, "element {} is in no placed layer", offset);
  return {0, 0};
}

void DeviceParameters::place_layers(const std::vector<std::pair<size_t, size_t>>& layers,
                                    size_t slot_floats, int slots) {
  DDP_CHECK(!layers_placed() && !layers.empty() && slots >= 2,
            "place_layers: already placed, no layers, or {} slots", slots);
  for (const auto& [offset, n] : layers)
    DDP_CHECK(offset + n <= count_ && n <= slot_floats,
              "place_layers: a layer of {} at {} in slots of {} ({} parameters)", n, offset,
              slot_floats, count_);
  for (int s = 0; s < slots; ++s) {
    slots_.emplace_back(slot_floats, MemoryCategory::kParameters);
    if (bf16_) slots16_.emplace_back(slot_floats, MemoryCategory::kParameters);
  }
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  layers_ = layers;
  params_ = DeviceBuffer<float>();
  params16_ = DeviceBuffer<uint16_t>();
}

void DeviceParameters::layer_to_low_precision(size_t layer, cudaStream_t stream) {
  DDP_CHECK(layers_placed() && layer < layers_.size(), "layer_to_low_precision({}): not placed",
            layer);
  if (bf16_)
    launch_to_bf16(slots_[layer % slots_.size()].data(), slots16_[layer % slots16_.size()].data(),
                   layers_[layer].second, stream);
}

void DeviceParameters::set(const float* host) {
  DDP_CHECK(!layers_placed(),
            "DeviceParameters::set: the layers are placed; their owner sets them");
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(params_.data(), host, params_.bytes(), cudaMemcpyHostToDevice, stream_));
  refresh_low_precision();
}

void DeviceParameters::get(float* host) const {
  DDP_CHECK(!layers_placed(), "DeviceParameters::get: the layers are placed; their owner has them");
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host, params_.data(), params_.bytes(), cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::get_grads(float* host) const {
  DDP_CHECK(!ringed(), "the gradients are in a ring of slots, not one buffer");
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host, grads_.data(), grads_.bytes(), cudaMemcpyDeviceToHost, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::refresh_low_precision() {
  to_low_precision(stream_);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::to_low_precision(cudaStream_t stream) {
  if (layers_placed()) return;  // each layer's copy is made as its slot is filled
  if (bf16()) launch_to_bf16(params_.data(), params16_.data(), params_.count(), stream);
}

void DeviceParameters::update(size_t offset, size_t count, const OptStep* steps, const int* counter,
                              cudaStream_t stream) {
  DDP_CHECK(!ringed(), "the whole-buffer update without the whole gradient buffer (a ring)");
  update_piece(offset, grads_.data() + offset, offset, count, steps, counter, stream);
}

void DeviceParameters::resize_optimizer(size_t count) {
  optimizer_->resize(count, stream_);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceParameters::update_piece(size_t offset, const float* grads, size_t state_offset,
                                    size_t count, const OptStep* steps, const int* counter,
                                    cudaStream_t stream) {
  DDP_CHECK(!layers_placed(), "optimizer update {}+{}: the layers are placed (update_at)", offset,
            count);
  DDP_CHECK(offset + count <= params_.count(), "optimizer update {}+{} past {} parameters", offset,
            count, params_.count());
  optimizer_->update(params_.data() + offset, grads, bf16() ? params16_.data() + offset : nullptr,
                     state_offset, count, steps, counter, stream);
}

void DeviceParameters::update_at(float* params, const float* grads, size_t state_offset,
                                 size_t count, const OptStep* steps, const int* counter,
                                 cudaStream_t stream) {
  optimizer_->update(params, grads, nullptr, state_offset, count, steps, counter, stream);
}

std::vector<std::pair<std::string, std::vector<float>>> DeviceParameters::optimizer_state() const {
  return optimizer_->state(stream_);
}

void DeviceParameters::set_optimizer_state(
    const std::vector<std::pair<std::string, std::vector<float>>>& state) {
  optimizer_->set_state(state, stream_);
}

}  // namespace ddp
