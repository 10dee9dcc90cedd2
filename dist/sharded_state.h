// ZeRO's state (--zero 1, 2, 3) over a Reducer's group, written once for the host and the device:
// this rank's pieces of the buckets (ShardedBuckets), and at level 3 of the parameters; which
// pieces the optimizer updates and the gather of every rank's pieces after it (1, 2); the whole
// parameters and optimizer state gathered out to a host copy and cut back into pieces from one
// (checkpoints, evaluation copies). Where the memory is and how it is copied is the store's
// (ParamStore, dist/param_store.h): the CPU's vectors, the GPU's memory on its stream, a LibTorch
// module's per-dtype tensors. A runner's replica keeps it in its ReplicaState
// (dist/replica_state.h: the optimizer's update and level 3's layer gathers); LibTorch's
// DistributedDataParallel in its TorchParams (the user's optimizer steps whole tensors).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/param_store.h"
#include "dist/sharded_buckets.h"
#include "dist/state_pieces.h"

namespace ddp {

class ShardedState {
 public:
  // `ddp`'s buckets cut into this rank's pieces at `level` as `cut` says (from now on, 2 and
  // 3, the Reducer reduce-scatters through them) in `store`'s memory; level 3 takes this rank's
  // pieces of the store's parameters (the store then frees its whole ones), its layer gathers
  // on `gathers` (null: the Reducer's communicator).
  ShardedState(Reducer& ddp, int level, ParamStore& store, Communicator* gathers,
               ShardCut cut = {});

  int level() const { return shards_->level(); }
  const ShardPlan& plan() const { return shards_->plan(); }
  ShardedBuckets& buckets() { return *shards_; }
  const ShardedBuckets& buckets() const { return *shards_; }
  // Level 3: this rank's pieces of the parameters of one float32 buffer (ddptrain's;
  // plan().shard_count, the padding zero); else null.
  float* pieces() { return static_cast<float*>(piece_memory(0)); }
  const float* pieces() const {
    return static_cast<const float*>(pieces_.empty() ? nullptr : pieces_[0].get());
  }
  size_t piece_floats() const { return pieces_.empty() ? 0 : plan().shard_count; }
  // Level 3: this rank's pieces of buffer b's parameters (plan().shard_counts[b] elements,
  // the padding zero); else null.
  void* piece_memory(size_t buffer) { return pieces_.empty() ? nullptr : pieces_.at(buffer).get(); }

  // What the step's update updates, after Reducer::finish() (one float32 buffer, equal pieces):
  // each of this rank's non-empty pieces, its parameters at `offset` (levels 1, 2: of the
  // whole parameters; 3: of pieces()), its averaged gradients and its place in the optimizer's
  // state (over the pieces).
  std::vector<OptimizerPiece> owned_pieces() const;
  // After the update: (1, 2) every rank's pieces gathered into the whole parameters.
  void updated();
  // Level 3, collective: every rank's pieces gathered into `whole` (one a buffer, the store's
  // memory), as the parameters are before a forward that uses them whole.
  void gather_params(const std::vector<void*>& whole);
  // Level 3, collective: bucket b's pieces of every rank gathered into its place in `whole`
  // (its buffer's memory), not waited for (device communicators: the Work makes a stream wait):
  // one unit's gather before its use, the next one's started meanwhile. The bucket's pieces must
  // be the bucket itself (equal pieces whose total is its size).
  std::unique_ptr<Work> gather_bucket(size_t b, void* whole);
  // The same from `pieces` (this rank's pieces of the bucket's buffer as elements of `type`,
  // laid out as its own): parameters gathered in another dtype than their master pieces'.
  std::unique_ptr<Work> gather_bucket(size_t b, void* whole, const void* pieces, DataType type);

  // Collective over the group: the whole parameters (`count`, the rank's flat layout) on the
  // host; and this rank's pieces set from a whole host copy (every rank gives the same). One
  // float32 buffer; nothing may read the pieces meanwhile (level 3's gathers settled).
  std::vector<float> params(size_t count);
  void set_params(const float* host);
  // Collective: each of the optimizer's state `buffers` (this rank's pieces, in the store's
  // memory) gathered whole (`count` each) on the host; and a whole state cut into this rank's
  // pieces, for the optimizer to take. One float32 buffer.
  NamedState optimizer_state(size_t count,
                             const std::vector<std::pair<std::string, const float*>>& buffers);
  NamedState pieces_of(const NamedState& whole) const;

 private:
  ParamStore& store_;
  MemoryPort memory_;  // the store's, or the host's
  std::unique_ptr<ShardedBuckets> shards_;
  std::vector<std::shared_ptr<void>> pieces_;  // level 3: each buffer's
};

}  // namespace ddp
