// ZeRO (--zero 1, 2, 3) on the host over a Ddp's group, in one place: the gradient ring of
// bucket slots (2, 3, where backward runs once a step), the sharded optimizer's update of this
// rank's pieces and the parameters' gather after it (1, 2) or (3) for each use of a layer
// (LayerParams: gathered at acquire, dropped at release; while materialised, every layer's once),
// and the host copies of the sharded parameters and optimizer state (collectives over the
// group). The CPU runner supplies its flat buffers and optimizer and calls it where the step
// reaches these points.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/sync/ddp.h"
#include "engine/sync/sharded_buckets.h"
#include "models/linear_cpu.h"
#include "models/optimizer.h"

namespace ddp {

class GatheredLayers;

class HostZero {
 public:
  // Shards `ddp`'s state at `level` (its buckets' gathers on `gathers`, null: its own), its
  // gradients in a ring of bucket slots where `ring` (the gradient ring applies:
  // engine/sync/gradient_ring.h) and the ring holds less than the whole buffer; level 3 takes this
  // rank's pieces of `params` (the rank's whole parameters, `layers` being each of its layers'
  // model index and span of them, in order).
  HostZero(Ddp& ddp, int level, bool ring, const std::vector<float>& params,
           const std::vector<std::pair<int, ParamSpan>>& layers, Communicator* gathers);
  ~HostZero();

  int level() const { return level_; }
  // The floats of this rank's pieces (the sharded optimizer's state has as many).
  size_t shard_count() const { return shards_->plan().shard_count; }
  // This rank's pieces of the buckets.
  const ShardPlan& plan() const { return shards_->plan(); }
  // With a ring: where backward writes the gradient of element `offset` of the flat buffer.
  bool ringed() const { return !ring_.empty(); }
  float* grad_at(size_t offset);
  // Level 3: where the layers read their parameters (null below).
  LayerParams* layer_params();
  bool shards_parameters() const { return level_ == 3; }

  // Whether any of this rank's averaged gradient pieces is NaN or Inf (levels 2, 3; else no).
  bool pieces_nonfinite() const;
  // The update of this rank's pieces by `optimizer` (over shard_count() floats) at `lr`; then
  // (1, 2) every rank's pieces gathered into the whole parameters `params`.
  void step(Optimizer& optimizer, float* params, float lr);

  // Level 3, collective: the whole parameters (`count`, the rank's flat layout); and this
  // rank's pieces set from a whole host copy.
  std::vector<float> params(size_t count);
  void set_params(const float* host);
  // Collective: `optimizer`'s state gathered whole (`count` each); and its pieces set from one.
  NamedState optimizer_state(Optimizer& optimizer, size_t count);
  void set_optimizer_state(Optimizer& optimizer, const NamedState& state);
  // Level 3, collective: every layer's parameters gathered once for an evaluation (the
  // replicas' shares may differ in length, so their uses could not match), until its end.
  void begin_evaluation(size_t count);
  void end_evaluation();

  // What it holds, as the runner's memory report says it (`size` formats floats), and the
  // floats by kind: this rank's pieces and the most layers gathered at once; the ring, the
  // padded buckets' copies and the averaged pieces.
  std::string memory_report(size_t count, size_t state_floats,
                            const std::function<std::string(size_t)>& size) const;
  size_t param_floats() const;
  size_t grad_floats() const;

 private:
  size_t ring_floats() const { return ring_.empty() ? 0 : ring_.size() * ring_[0].size(); }

  Ddp& ddp_;
  int level_;
  // The gradients in kGradientRingSlots bucket slots (bucket b in slot b % slots, each written
  // again only after its reduce-scatter, which layer_done waits for) and the averaged pieces,
  // as on the GPU.
  std::vector<std::vector<float>> ring_;
  std::vector<std::vector<float>> ring_pieces_;  // what Ddp allocates: the averaged pieces
  ShardMemory ring_memory_;
  std::unique_ptr<ShardedBuckets> shards_;    // the buckets' pieces, reduce-scatters, gathers
  std::vector<float> shard_params_;           // level 3: this rank's pieces of the parameters
  std::unique_ptr<GatheredLayers> gathered_;  // level 3: the layers' parameters for each use
};

}  // namespace ddp
