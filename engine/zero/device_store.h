// The GPU runner's parameters as the data-parallel layer keeps them (ReplicaStore,
// dist/param_store.h): the rank's flat DeviceParameters on its compute stream, their update
// kernels, and the state over them (ReplicaState, dist/replica_state.h: whole, the runner's own
// update, until gradient sync shards it). Sharded, the memory is device memory on the stream:
// the padded buckets' copies and (2, 3) the gradient ring in DeviceParameters, this rank's
// pieces updated by the device optimizer, level 3's gather slots (and their bf16 copies). The
// runner reads the state and the Reducer from here and, once sharded, wires its layers where the
// state says (its `rewire`). Only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/gradient_ring.h"
#include "dist/param_store.h"
#include "dist/replica_state.h"
#include "dist/sync_options.h"
#include "models/device_parameters.h"
#include "runtime/device_buffer.h"

namespace ddp {

// --zero 2 and 3's gradient ring (dist/gradient_ring.h) as the device memory of
// `buckets` (the stage's BucketPlan, which its Reducer reduces; offsets in the stage's flat buffer
// of `param_count`), or none (a stage's gradients in one buffer).
GradientRing device_gradient_ring(const std::vector<Bucket>& buckets, size_t param_count,
                                  const RingLayout& layout);

// What the store is made from: the rank's parameters (`count`), their layers as spans of the
// flat buffers (in order; `stage_layers` of them each of the rank's stages), their buckets,
// whether the gradients go into a ring, and gradient sync's options.
struct DeviceStoreLayout {
  size_t count = 0;
  std::vector<std::pair<size_t, size_t>> layers;
  std::vector<int> stage_layers;
  BucketPlan plan;
  RingLayout ring;
  SyncOptions sync;
};

class DeviceParamStore final : public ReplicaStore {
 public:
  // The whole state's update (the runner's: one pass over the buffers, or its stages') with
  // the feeder's scalars.
  using Update = std::function<void(const OptStep* steps, const int* counter)>;
  // Over the rank's buffers `weights` on `stream`; `update` is the whole state's step.
  DeviceParamStore(DeviceStoreLayout layout, DeviceParameters& weights, cudaStream_t stream,
                   Update update);
  ~DeviceParamStore() override;

  // The Reducer that join() was given (null: no data parallelism).
  Reducer* ddp() const { return ddp_; }
  // Whether this rank logs what it sets up (rank 0, known once the world is), and the data
  // parallelism's line too (the whole model's runner says it).
  void set_lead(bool lead, bool announce) {
    lead_ = lead;
    announce_ = announce;
  }
  // How the host waits for the stream where a copy of the sharded state needs it
  // (cudaStreamSynchronize until set).
  void set_wait(std::function<void()> wait) { wait_ = std::move(wait); }
  // The feeder's scalars every update reads (device memory, fixed for the run).
  void set_step_scalars(const OptStep* steps, const int* counter) {
    steps_ = steps;
    counter_ = counter;
  }
  // Called with the state once sharded.
  void set_rewire(std::function<void(ReplicaState&)> rewire) { rewire_ = std::move(rewire); }

  // ParamStore: device memory on the stream.
  const MemoryPort* memory() const override { return &memory_; }
  const RingSlots* ring() const override { return ring_.slots > 0 ? &ring_ : nullptr; }
  std::vector<GradMemory> param_memory() override {
    return {{weights_.params(), DataType::kFloat32}};
  }
  void* stream() override { return stream_; }
  std::shared_ptr<void> allocate(size_t bytes, bool pieces) override;
  std::vector<float> to_host(const float* src, size_t floats) override;
  void from_host(float* dst, const float* host, size_t floats) override;
  std::vector<float> whole_params() override;
  void set_whole_params(const float* host) override { weights_.set(host); }
  void params_gathered() override { weights_.to_low_precision(stream_); }

  // ReplicaStore.
  const BucketPlan& bucket_plan() const override { return layout_.plan; }
  float* params() override { return weights_.params(); }
  size_t count() const override { return layout_.count; }
  void params_changed() override { weights_.refresh_low_precision(); }
  void join(Reducer& ddp, uint64_t fingerprint, const std::string& description) override;
  ReplicaState& state() override { return state_; }
  std::vector<ParamSpan> layer_spans() const override;
  std::vector<int> stage_layers() const override { return layout_.stage_layers; }
  int gather_ahead() const override { return layout_.sync.zero_prefetch; }
  void begin_sharding(Reducer& ddp, int level) override;
  void sharded(ReplicaState& state) override;
  void size_optimizer(size_t floats) override { weights_.resize_optimizer(floats); }
  void update_whole() override { update_(steps_, counter_); }
  void update_pieces(float* params, const std::vector<OptimizerPiece>& pieces) override;
  std::vector<std::pair<std::string, const float*>> optimizer_buffers() override;
  NamedState optimizer_state() override { return weights_.optimizer_state(); }
  void set_optimizer_state(const NamedState& state) override {
    weights_.set_optimizer_state(state);
  }
  void place_layers(size_t slot_floats, int slots) override {
    weights_.place_layers(layout_.layers, slot_floats, slots);
  }
  float* layer_slot(int layer) override { return weights_.layer_slot(static_cast<size_t>(layer)); }
  void layer_used(int layer) override {
    weights_.layer_to_low_precision(static_cast<size_t>(layer), stream_);
  }

 private:
  void wait();

  DeviceStoreLayout layout_;
  DeviceParameters& weights_;
  cudaStream_t stream_;
  Update update_;
  const OptStep* steps_ = nullptr;
  const int* counter_ = nullptr;
  MemoryPort memory_;  // the buckets' device memory (padded copies, pieces) and copies
  RingSlots ring_;     // the gradient ring's slots, or none
  Reducer* ddp_ = nullptr;
  DeviceBuffer<uint16_t> bf16_wire_;  // the gradients on the wire with --grad-reduce bf16
  // --nccl-symmetric: the gradients and the wire copy registered with the Reducer's communicator
  // (after the buffers: undone before they are freed).
  std::vector<std::unique_ptr<Communicator::Window>> windows_;
  bool lead_ = true;
  bool announce_ = false;
  std::function<void()> wait_;
  std::function<void(ReplicaState&)> rewire_;
  ReplicaState state_{*this};
};

}  // namespace ddp
