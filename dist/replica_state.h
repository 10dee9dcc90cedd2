// A replica's state over its store (ReplicaStore, dist/param_store.h), written once for the CPU
// and the GPU: whole (one replica, or plain data parallelism: the store's optimizer updates
// every parameter from the whole averaged gradients) until shard() makes it ZeRO's (--zero 1,
// 2, 3: ShardedState, dist/sharded_state.h), whose update is this rank's pieces, whose host
// copies are collectives, and whose level 3 gathers each layer's parameters into the store's
// slots before its use (LayerGathers' decisions, dist/layer_gathers.h, carried out blocking
// over a host communicator and on the store's stream over a device one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/layer_gathers.h"
#include "dist/param_store.h"
#include "dist/sharded_state.h"
#include "dist/state_pieces.h"

namespace ddp {

class ReplicaState {
 public:
  explicit ReplicaState(ReplicaStore& store) : store_(store) {}
  ReplicaState(const ReplicaState&) = delete;
  ReplicaState& operator=(const ReplicaState&) = delete;

  // From now on this rank's pieces of `ddp`'s buckets at `level` (level 3's gathers on
  // `gathers`, null: the Reducer's communicator). Returns the pieces.
  const ShardPlan& shard(Reducer& ddp, int level, Communicator* gathers);
  bool sharded() const { return sharded_ != nullptr; }
  int level() const { return sharded_ ? sharded_->level() : 0; }
  // Sharded: the pieces and the buckets they are cut from.
  const ShardPlan& plan() const { return sharded_->plan(); }
  const ShardedState& pieces() const { return *sharded_; }
  ShardedState& pieces() { return *sharded_; }

  // The step's update, after the gradients are reduced (every gather still pending waited for
  // first): whole, the store's; sharded, this rank's pieces, then (1, 2) every rank's gathered
  // into the whole parameters.
  void step();
  // Where the update runs, as the start-up line says it ("after backward, on this rank's 1234
  // of 2468 parameters").
  std::string describe_update(size_t count) const;

  // Level 3: a layer's parameters are gathered into a slot before each use (the store's layer
  // i: the rank's i-th layer).
  bool gathers_layers() const { return level() == 3; }
  // Before the rank's layer `layer` is read: its parameters gathered into its slot (or already
  // there) and, `next` >= 0 being the pass's next layer, the next gather_ahead() layers of the
  // pass in its stage (on in the same direction) on their way into the others.
  void use_layer(int layer, int next);
  // The schedule's kUnshard and kReshard: layer `layer` (which a pass reads first) gathered now;
  // layers [first, end) let go.
  void prefetch_layer(int layer);
  void release_layers(int first, int end);
  // Every gather still pending waited for, what the slots hold forgotten: at a step's start and
  // before its update, so that every step, a captured one too, gathers alike.
  void forget_gathers();
  // After an evaluation: the replicas' shares of `samples` (one contiguous share each, in rank
  // order) may take one chunk of `chunk` samples more or less, and every chunk's forward
  // gathers every layer (collectives over the group); this replica, having forwarded `mine`
  // chunks, gathers as a forward would for the chunks it lacks against the replica with the
  // most, then forgets what the slots hold. Nothing below level 3.
  void match_evaluation(int64_t samples, int64_t mine, int chunk);
  // Each layer gather as it is issued (the GPU timeline's; `scheduled`: by the schedule's
  // kUnshard, else at a use), or none.
  void set_on_gather(std::function<void(int layer, bool scheduled, Work& gather)> on_gather) {
    on_gather_ = std::move(on_gather);
  }
  // Level 3: the gather slots, their number and elements each (0 below).
  int slots() const { return gathers_ ? gathers_->slots() : 0; }
  size_t slot_floats() const { return slot_floats_; }

  // Host copies (collectives over the group where sharded): the whole parameters (`count`, the
  // rank's flat layout) and optimizer state; and both set from whole host copies.
  std::vector<float> params(size_t count);
  void set_params(const float* host);
  NamedState optimizer_state(size_t count);
  void set_optimizer_state(const NamedState& state);

 private:
  void carry_out(const std::vector<LayerGathers::Action>& actions, bool scheduled = false);
  void gather_as_forwards(int64_t chunks);

  ReplicaStore& store_;
  std::unique_ptr<ShardedState> sharded_;         // null: whole
  std::vector<size_t> bucket_of_layer_;           // level 3: the rank's layer i -> its bucket
  std::vector<int> stage_of_layer_;               // and -> its stage among the rank's
  std::vector<std::unique_ptr<Work>> gathering_;  // by layer: its gather, until waited for
  std::unique_ptr<LayerGathers> gathers_;         // which to gather and wait for, when
  size_t slot_floats_ = 0;
  std::function<void(int, bool, Work&)> on_gather_;
};

}  // namespace ddp
