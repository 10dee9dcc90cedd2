// The CPU runner's parameters as gradient sync keeps them (ParamStore): the rank's stages'
// parameters and gradients in two flat host buffers, and the state over them (HostState:
// HostWhole until shard() makes it HostZero). The runner wires its model to the buffers and,
// after shard(), where the state says (its `rewire`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dist/param_store.h"
#include "engine/zero/host_state.h"
#include "models/optimizer.h"

namespace ddp {

// What the store is made from: the rank's layers (each its model index and span of the flat
// buffer, in order), their buckets, how backward runs (for the gradient ring) and the optimizer.
struct HostStoreLayout {
  size_t count = 0;                               // the rank's parameters
  std::vector<std::pair<int, ParamSpan>> layers;  // the model's layer and its span
  BucketPlan plan;
  int stages_on_rank = 1;
  int micro_batches = 1;
  OptimizerConfig optimizer;
  bool bf16_grads = false;  // the gradients cross the wire as bf16 (--grad-reduce bf16)
};

class HostParamStore final : public ParamStore {
 public:
  explicit HostParamStore(HostStoreLayout layout);

  // The buffers (every stage's, one after the other; the gradients' empty with a ring) and the
  // state over them.
  std::vector<float>& params_buffer() { return params_; }
  std::vector<float>& grads_buffer() { return grads_; }
  const std::vector<float>& params_buffer() const { return params_; }
  const std::vector<float>& grads_buffer() const { return grads_; }
  HostState& state() { return *state_; }
  const HostState& state() const { return *state_; }
  // Called with the new state after shard(), so that the model writes its gradients and reads
  // its parameters where the state keeps them.
  void set_rewire(std::function<void(HostState&)> rewire) { rewire_ = std::move(rewire); }

  // ParamStore.
  const BucketPlan& bucket_plan() const override { return layout_.plan; }
  float* params() override { return params_.data(); }
  size_t count() const override { return layout_.count; }
  void params_changed() override {}  // the parameters are read where they are written
  void join(Reducer& ddp, uint64_t fingerprint, const std::string& description) override;
  const ShardPlan& shard(Reducer& ddp, int level, Communicator* gathers) override;

 private:
  HostStoreLayout layout_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<uint16_t> bf16_wire_;  // --grad-reduce bf16: the gradients as they travel
  std::unique_ptr<HostState> state_;
  std::function<void(HostState&)> rewire_;
};

}  // namespace ddp
