// ZeRO (--zero 1, 2, 3) on the host over a Reducer's group: the home of the sharded state
// (ShardedState, dist/sharded_state.h: the pieces, the update's protocol, the host copies)
// in the CPU's vectors, with what is the host's own: the gradient ring of bucket slots (2, 3,
// where backward runs once a step), the host optimizer over this rank's pieces, and level 3's
// layer parameters (LayerParams: gathered at acquire, dropped at release; while materialised,
// every layer's once). It is the sharded strategy of HostState (engine/zero/host_state.h); the
// CPU runner supplies its flat buffers and wires its model where the state says.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/ddp.h"
#include "dist/gradient_ring.h"
#include "dist/sharded_buckets.h"
#include "dist/sharded_state.h"
#include "engine/zero/host_state.h"
#include "models/linear_cpu.h"
#include "models/optimizer.h"

namespace ddp {

class GatheredLayers;

class HostZero final : public HostState, private ShardHome {
 public:
  // Shards `ddp`'s state at `layout.zero`'s level (its buckets' gathers on `gathers`, null: its
  // own), the gradients in a ring of bucket slots where the ring applies
  // (dist/gradient_ring.h) and holds less than the whole buffer; the runner's buffers
  // `params` and `grads` (the rank's whole parameters, `layers` being each of its layers' model
  // index and span of them, in order) stay where used, its optimizer keeping this rank's
  // pieces' state only; level 3 takes this rank's pieces of `params`.
  HostZero(Reducer& ddp, const RingLayout& layout, std::vector<float>& params,
           std::vector<float>& grads, const std::vector<std::pair<int, ParamSpan>>& layers,
           Communicator* gathers, const OptimizerConfig& optimizer);
  ~HostZero() override;

  int level() const { return state_->level(); }
  // This rank's pieces of the buckets.
  const ShardPlan& plan() const { return state_->plan(); }

  // HostState: with a ring, backward writes into its bucket's slot; level 3's layers read
  // their parameters gathered for each use.
  std::function<float*(size_t offset)> gradient_home() override;
  LayerParams* layer_params() override;
  // Whether any of this rank's averaged gradient pieces is NaN or Inf (levels 2, 3; else no).
  bool kept_grads_nonfinite() const override;
  // The update of this rank's pieces at `lr`; then (1, 2) every rank's pieces gathered into the
  // whole parameters.
  void step(float lr) override;
  // Level 3, collective: the whole parameters (`count`, the rank's flat layout); and this
  // rank's pieces set from a whole host copy. Below, the runner's buffer.
  std::vector<float> params(size_t count) override;
  void set_params(const float* host) override;
  // Collective: the optimizer's state gathered whole (`count` each); and its pieces set from one.
  NamedState optimizer_state(size_t count) override;
  void set_optimizer_state(const NamedState& state) override;
  // Level 3, collective: every layer's parameters gathered once for an evaluation (the
  // replicas' shares may differ in length, so their uses could not match), until its end.
  void begin_evaluation(size_t count) override;
  void end_evaluation() override;

  // The floats by kind: this rank's pieces and the most layers gathered at once; the ring, the
  // padded buckets' copies and the averaged pieces.
  std::string memory_report(size_t count,
                            const std::function<std::string(size_t)>& size) const override;
  size_t param_floats() const override;
  size_t grad_floats() const override;

 private:
  // ShardHome: the runner's buffers and host vectors.
  const MemoryPort* memory() const override { return nullptr; }
  const RingSlots* ring() const override { return ringed() ? &ring_slots_ : nullptr; }
  std::vector<GradMemory> param_memory() override { return {{params_.data(), DataType::kFloat32}}; }
  void* stream() override { return nullptr; }
  std::shared_ptr<void> allocate(size_t bytes, bool pieces) override;
  std::vector<float> to_host(const float* src, size_t floats) override;
  void from_host(float* dst, const float* host, size_t floats) override;
  std::vector<float> whole_params() override { return params_; }
  void set_whole_params(const float* host) override;

  bool ringed() const { return !ring_.empty(); }
  // With a ring: where backward writes the gradient of element `offset` of the flat buffer.
  float* grad_at(size_t offset);
  size_t ring_floats() const { return ring_.empty() ? 0 : ring_.size() * ring_[0].size(); }

  Reducer& ddp_;
  std::vector<float>& params_;  // the runner's buffers (level 3: the parameters freed)
  std::vector<float>& grads_;
  // The gradients in kGradientRingSlots bucket slots (bucket b in slot b % slots, each written
  // again only after its reduce-scatter, which layer_done waits for) and the averaged pieces,
  // as on the GPU.
  std::vector<std::vector<float>> ring_;
  RingSlots ring_slots_;
  std::unique_ptr<ShardedState> state_;       // the pieces, their update, the host copies
  std::unique_ptr<GatheredLayers> gathered_;  // level 3: the layers' parameters for each use
};

}  // namespace ddp
