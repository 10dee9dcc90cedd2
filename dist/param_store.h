// A replica's parameters where the data-parallel layer reaches them, in two levels:
//
// - ParamStore: the parameters' memory, host or device, in each gradient buffer's dtype: where
//   the collectives take them, the memory the sharded state's pieces and copies go in and how
//   it copies, and host copies. What ShardedState (dist/sharded_state.h) runs over; the CPU
//   MLP's flat vectors, the GPU MLP's DeviceParameters (engine/zero) and a LibTorch module's
//   per-dtype tensors (torch/torch_params.h) are three of them.
// - ReplicaStore: a ParamStore whose optimizer the layer runs (ddptrain's runners): what
//   gradient sync asks (GradSync, dist/grad_sync.h: the buckets, the model check, the
//   broadcast) and what the replica's state asks (ReplicaState, dist/replica_state.h: the
//   optimizer's update whole or over pieces, its state, the rank's layers and the slots level
//   3 gathers them into). The runner reads its parameters through the store; it names no ZeRO.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "dist/buckets.h"
#include "dist/ddp.h"
#include "dist/sharded_buckets.h"
#include "dist/state_pieces.h"
#include "dist/zero.h"
#include "runtime/memory_port.h"

namespace ddp {

class ReplicaState;

class ParamStore {
 public:
  virtual ~ParamStore() = default;

  // The memory the buckets' padded copies and averaged pieces go in and the state's copies
  // run in (null: the host's), and the gradient ring's slots (null: none).
  virtual const MemoryPort* memory() const = 0;
  virtual const RingSlots* ring() const { return nullptr; }
  // The rank's whole flat parameters where the collectives take them, one a gradient buffer
  // of the same layout and dtype (null data: not kept whole now), and the stream the
  // collectives and copies are ordered on (null: the host's thread).
  virtual std::vector<GradMemory> param_memory() = 0;
  virtual void* stream() = 0;
  // `bytes` of this memory for as long as the result is kept: level 3's pieces of the
  // parameters (`pieces`, zero), or a whole copy on its way out (any values). Apart from
  // memory()'s allocations, as the device counts the parameters apart.
  virtual std::shared_ptr<void> allocate(size_t bytes, bool pieces) = 0;
  // Copies of float32 values out to the host and in from it, done when they return.
  virtual std::vector<float> to_host(const float* src, size_t floats) = 0;
  virtual void from_host(float* dst, const float* host, size_t floats) = 0;
  // The whole float32 parameters out to the host and in from it, as a replica that keeps them
  // whole does.
  virtual std::vector<float> whole_params() = 0;
  virtual void set_whole_params(const float* host) = 0;
  // A gather wrote the whole parameters: whatever the store derives from them made again (the
  // device's low-precision copy); nothing where it derives nothing.
  virtual void params_gathered() {}
};

class ReplicaStore : public ParamStore {
 public:
  // Gradient sync. The buckets of the rank's stages (planned once, when the store was made):
  // the Reducer's. The flat float32 parameters (count() of them) where the group's
  // communicator takes them; params_changed() after something wrote them there (a broadcast).
  virtual const BucketPlan& bucket_plan() const = 0;
  virtual float* params() = 0;
  virtual size_t count() const = 0;
  virtual void params_changed() = 0;
  // Makes `ddp` reach this memory (the GPU: its stream, the device copies, --grad-reduce
  // bf16's wire) and checks, collectively, that every replica holds the same model:
  // `fingerprint` identifies it, `description` names it in the error ("--layers 12,8,4").
  virtual void join(Reducer& ddp, uint64_t fingerprint, const std::string& description) = 0;
  // The state the parameters are kept in (whole from the start).
  virtual ReplicaState& state() = 0;
  // From now on the optimizer state (1), the averaged gradients (2) and the parameters (3) are
  // kept as this rank's pieces of `ddp`'s buckets (the gathers of level 3 on `gathers`, null:
  // the Reducer's communicator): state().shard. Returns the pieces.
  const ShardPlan& shard(Reducer& ddp, int level, Communicator* gathers);

  // The rank's layers as spans of the flat buffer (in order), how many of them each of its
  // stages holds, and how many layers level 3 gathers ahead of the one in use.
  virtual std::vector<ParamSpan> layer_spans() const = 0;
  virtual std::vector<int> stage_layers() const = 0;
  virtual int gather_ahead() const = 0;
  // Sharding at `level` over `ddp`'s group begins: the gradient ring made where it applies
  // (ring() from then on). And it is done (`state` sharded): the store lets go of what the
  // state keeps instead and wires its model where the state says.
  virtual void begin_sharding(Reducer& ddp, int level) = 0;
  virtual void sharded(ReplicaState& state) = 0;

  // The optimizer: over `floats` parameters from now on (this rank's pieces); the update of
  // every parameter from the whole gradients; the update of `pieces` (OptimizerPiece::offset
  // into `params`: level 3's pieces, or null: the whole parameters); its state's buffers (in
  // this store's memory), a whole host copy of them, and them set from a host copy by name
  // (whole, or this rank's pieces).
  virtual void size_optimizer(size_t floats) = 0;
  virtual void update_whole() = 0;
  virtual void update_pieces(float* params, const std::vector<OptimizerPiece>& pieces) = 0;
  virtual std::vector<std::pair<std::string, const float*>> optimizer_buffers() = 0;
  virtual NamedState optimizer_state() = 0;
  virtual void set_optimizer_state(const NamedState& state) = 0;

  // Level 3: the layers read their parameters from `slots` slots of `slot_floats` from now on,
  // layer i from layer_slot(i) (the whole parameters let go); layer_used(i) after a gather
  // filled its slot, before the layer reads it (the device's low-precision copy made).
  virtual void place_layers(size_t slot_floats, int slots) = 0;
  virtual float* layer_slot(int layer) = 0;
  virtual void layer_used(int layer) { (void)layer; }
};

}  // namespace ddp
