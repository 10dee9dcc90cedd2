// A model's or a pipeline stage's flat parameters on the GPU, their own part: float32
// parameters and gradients, the bf16 copy the products read with bf16 precision, and the
// optimizer over them (DeviceOptimizer), with host copies for checkpoints. Used by the whole
// model and by a pipeline stage (both a CudaStage). Only built with CUDA. Every call is on the
// owner's stream, given at construction, and the host copies synchronise it.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/optimizer.h"
#include "models/optimizer_cuda.h"
#include "runtime/device_buffer.h"

namespace ddp {

// The gradients without the whole buffer: `slots` buffers of `slot_floats` each, the
// gradients of range b (elements [offset, + count) of the flat layout, in the ranges' order)
// written in slot b % slots. Whoever reads a range must be done with its slot before the range
// `slots` later is written (the owner's choice; ddp's gradient sync makes it for its buckets:
// dist/gradient_ring.h).
struct GradientRing {
  std::vector<std::pair<size_t, size_t>> buckets;  // offset, count
  size_t slot_floats = 0;
  int slots = 0;  // 0: one whole gradient buffer
};

class DeviceParameters {
 public:
  // `grads_memory`: where the whole gradient buffer comes from (null: cudaMalloc; NCCL's
  // window memory for --nccl-symmetric).
  DeviceParameters(size_t count, bool bf16, const OptimizerConfig& optimizer, cudaStream_t stream,
                   GradientRing ring = {}, const DeviceAllocator* grads_memory = nullptr);

  size_t count() const { return count_; }
  // The whole float32 parameters (null once place_layers() freed them).
  float* params() const { return params_.data(); }
  float* grads() const { return grads_.data(); }  // null with a gradient ring
  // Where the whole gradient buffer came from (null: cudaMalloc).
  const DeviceAllocator* grads_memory() const { return grads_.allocator(); }
  // Where the gradient of element `offset` is written (the whole buffer, or its range's slot).
  float* grad_at(size_t offset) const;
  bool ringed() const { return ring_.slots > 0; }
  const GradientRing& ring() const { return ring_; }
  // The slot of range b (with a ring).
  float* bucket_grads(size_t bucket) const;
  // Every gradient element set to `value` (autotuning's real values, a test's NaN).
  void fill_grads(float value, cudaStream_t stream);
  uint16_t* params16() const { return params16_.data(); }  // null without bf16 (or placed)
  bool bf16() const { return bf16_; }
  // Element `offset` as the products read it: of the bf16 copy with bf16 precision, else of
  // the float32 parameters; once placed, of its layer's slot (or the slot's bf16 copy).
  void* for_products(size_t offset) const;
  // Element `offset` of the float32 parameters (once placed: of its layer's slot).
  float* param_at(size_t offset) const;

  // From now on the parameters are not kept here: layer i of `layers` (offset, count, in
  // order) is read from layer_slot(i), slot i % slots of `slots` slots of `slot_floats` (plus
  // their bf16 copies with bf16 precision), which the owner fills before each use (ddp's
  // gradient sync gathers it there). The whole buffer and its bf16 copy are freed; plans built on
  // them must be built again.
  void place_layers(const std::vector<std::pair<size_t, size_t>>& layers, size_t slot_floats,
                    int slots = 2);
  bool layers_placed() const { return !layers_.empty(); }
  float* layer_slot(size_t layer) const { return slots_[layer % slots_.size()].data(); }
  // After layer_slot(layer) was filled: its bf16 copy (none without bf16), on `stream`.
  void layer_to_low_precision(size_t layer, cudaStream_t stream);

  // Host copies (synchronous); set() also makes the bf16 copy.
  void set(const float* host);
  void get(float* host) const;
  void get_grads(float* host) const;
  // After the float32 parameters changed on the device (initialised there, or a broadcast):
  // the bf16 copy made again from them. Synchronises.
  void refresh_low_precision();

  // The optimizer on parameters [offset, offset + count) with the scalars steps[*counter]
  // (counter null: steps[0]), on `stream`: elementwise, so any partition of the buffer gives
  // bitwise the whole-buffer result.
  void update(size_t offset, size_t count, const OptStep* steps, const int* counter,
              cudaStream_t stream);
  // The optimizer keeps the state of `count` parameters only (the part its owner updates, as
  // the engine's sharded state its rank's pieces); update_piece updates parameters [offset, +
  // count) from the gradients at `grads` with the state's [state_offset, + count), and update_at
  // the same for `count` parameters kept elsewhere (at `params`, no bf16 copy).
  void resize_optimizer(size_t count);
  void update_piece(size_t offset, const float* grads, size_t state_offset, size_t count,
                    const OptStep* steps, const int* counter, cudaStream_t stream);
  void update_at(float* params, const float* grads, size_t state_offset, size_t count,
                 const OptStep* steps, const int* counter, cudaStream_t stream);
  DeviceOptimizer& optimizer() const { return *optimizer_; }
  // The bf16 copy made again from the float32 parameters on `stream`, without waiting (none
  // without bf16).
  void to_low_precision(cudaStream_t stream);
  // The optimizer's state for checkpoints: SGD "momentum"; AdamW "exp_avg", "exp_avg_sq".
  std::vector<std::pair<std::string, std::vector<float>>> optimizer_state() const;
  void set_optimizer_state(const std::vector<std::pair<std::string, std::vector<float>>>& state);

 private:
  // The layer of `layers_` that holds element `offset`, and where in it.
  std::pair<size_t, size_t> layer_of(size_t offset) const;

  cudaStream_t stream_;
  size_t count_;
  bool bf16_;
  DeviceBuffer<float> params_, grads_;
  GradientRing ring_;
  std::vector<DeviceBuffer<float>> ring_slots_;
  std::unique_ptr<DeviceOptimizer> optimizer_;
  DeviceBuffer<uint16_t> params16_;
  // Once placed: the layers' (offset, count) and their slots.
  std::vector<std::pair<size_t, size_t>> layers_;
  std::vector<DeviceBuffer<float>> slots_;
  std::vector<DeviceBuffer<uint16_t>> slots16_;
};

}  // namespace ddp
