// The CPU runner's parameters as the data-parallel layer keeps them (ReplicaStore,
// dist/param_store.h): the rank's stages' parameters and gradients in two flat host buffers, the
// host optimizer, and the state over them (ReplicaState, dist/replica_state.h: whole until
// gradient sync shards it). Sharded, it keeps what the state asks in host vectors: the
// gradient ring's bucket slots (2, 3, where backward runs once a step), the optimizer over this
// rank's pieces, level 3's gather slots; and it wires the model where the state says (its
// `rewire`: backward writing into the ring, the layers reading their parameters from the slots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/param_store.h"
#include "dist/replica_state.h"
#include "models/linear_cpu.h"
#include "models/optimizer.h"

namespace ddp {

// What the store is made from: the rank's layers (each its model index and span of the flat
// buffer, in order), their buckets, how backward runs (for the gradient ring) and the optimizer.
struct HostStoreLayout {
  size_t count = 0;                               // the rank's parameters
  std::vector<std::pair<int, ParamSpan>> layers;  // the model's layer and its span
  std::vector<int> stage_layers;                  // how many of them each stage of the rank has
  BucketPlan plan;
  int stages_on_rank = 1;
  int micro_batches = 1;
  OptimizerConfig optimizer;
  bool bf16_grads = false;  // the gradients cross the wire as bf16 (--grad-reduce bf16)
};

class HostParamStore final : public ReplicaStore {
 public:
  explicit HostParamStore(HostStoreLayout layout);
  ~HostParamStore() override;

  // The buffers (every stage's, one after the other; the gradients' empty with a ring, the
  // parameters' at level 3).
  std::vector<float>& params_buffer() { return params_; }
  std::vector<float>& grads_buffer() { return grads_; }
  const std::vector<float>& params_buffer() const { return params_; }
  const std::vector<float>& grads_buffer() const { return grads_; }
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  // The step's learning rate, before state().step().
  void set_lr(float lr) { lr_ = lr; }
  // Called once sharded, with where backward writes the gradient of element `offset` of the
  // flat layout (empty: in the buffer) and where the layers read their parameters for each use
  // (null: the buffer).
  using Rewire =
      std::function<void(std::function<float*(size_t offset)> grads, LayerParams* params)>;
  void set_rewire(Rewire rewire) { rewire_ = std::move(rewire); }

  // Whether a gradient kept apart from the buffer (levels 2, 3: this rank's averaged pieces)
  // is NaN or Inf.
  bool kept_grads_nonfinite() const;
  // What it holds, as the runner's memory report says it (`size` formats floats), and the
  // floats it holds beyond its buffers: parameters, gradients.
  std::string memory_report(const std::function<std::string(size_t)>& size) const;
  size_t param_floats() const;
  size_t grad_floats() const;

  // ParamStore: host vectors.
  const MemoryPort* memory() const override { return nullptr; }
  const RingSlots* ring() const override { return ringed() ? &ring_slots_ : nullptr; }
  std::vector<GradMemory> param_memory() override { return {{params_.data(), DataType::kFloat32}}; }
  void* stream() override { return nullptr; }
  std::shared_ptr<void> allocate(size_t bytes, bool pieces) override;
  std::vector<float> to_host(const float* src, size_t floats) override;
  void from_host(float* dst, const float* host, size_t floats) override;
  std::vector<float> whole_params() override { return params_; }
  void set_whole_params(const float* host) override;

  // ReplicaStore.
  const BucketPlan& bucket_plan() const override { return layout_.plan; }
  float* params() override { return params_.data(); }
  size_t count() const override { return layout_.count; }
  void params_changed() override {}  // the parameters are read where they are written
  void join(Reducer& ddp, uint64_t fingerprint, const std::string& description) override;
  ReplicaState& state() override { return state_; }
  std::vector<ParamSpan> layer_spans() const override;
  std::vector<int> stage_layers() const override { return layout_.stage_layers; }
  int gather_ahead() const override { return 0; }  // a layer asks at its use: none ahead
  void begin_sharding(Reducer& ddp, int level) override;
  void sharded(ReplicaState& state) override;
  void size_optimizer(size_t floats) override;
  void update_whole() override;
  void update_pieces(float* params, const std::vector<OptimizerPiece>& pieces) override;
  std::vector<std::pair<std::string, const float*>> optimizer_buffers() override;
  NamedState optimizer_state() override;
  void set_optimizer_state(const NamedState& state) override;
  void place_layers(size_t slot_floats, int slots) override;
  float* layer_slot(int layer) override;

 private:
  class SlotParams;

  bool ringed() const { return !ring_.empty(); }
  // With a ring: where backward writes the gradient of element `offset` of the flat buffer.
  float* grad_at(size_t offset);
  size_t ring_floats() const { return ring_.empty() ? 0 : ring_.size() * ring_[0].size(); }
  size_t slot_floats() const { return slots_.empty() ? 0 : slots_.size() * slots_[0].size(); }

  HostStoreLayout layout_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<uint16_t> bf16_wire_;  // --grad-reduce bf16: the gradients as they travel
  std::unique_ptr<Optimizer> optimizer_;
  float lr_ = 0;
  const std::vector<Bucket>* buckets_ = nullptr;  // sharded: the Reducer's
  // The gradients in kGradientRingSlots bucket slots (bucket b in slot b % slots, each written
  // again only after its reduce-scatter, which layer_done waits for), as on the GPU.
  std::vector<std::vector<float>> ring_;
  RingSlots ring_slots_;
  std::vector<std::vector<float>> slots_;  // level 3: the layers' gather slots
  std::unique_ptr<SlotParams> slot_params_;
  ReplicaState state_{*this};
  Rewire rewire_;
};

}  // namespace ddp
