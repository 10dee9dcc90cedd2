// ZeRO's state (--zero 1, 2, 3) over a Reducer's group, written once for the host and the device:
// this rank's pieces of the buckets (ShardedBuckets), and at level 3 of the parameters; which
// pieces the optimizer updates and the gather of every rank's pieces after it (1, 2); the whole
// parameters and optimizer state gathered out to a host copy and cut back into pieces from one
// (checkpoints, evaluation copies). Where the memory is and how it is copied is the home's
// (ShardHome): the CPU's vectors (HostZero) or the GPU's memory on its stream (DeviceZero), which
// also keep their own optimizer (the host's Optimizer, the device's kernels) and the layer
// gathers of level 3 (the host's for each use, the device's ahead of it on a stream).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/sharded_buckets.h"
#include "dist/state_pieces.h"

namespace ddp {

// Where a replica's sharded state lives: its memory, host or device, in bytes.
class ShardHome {
 public:
  virtual ~ShardHome() = default;

  // The memory the buckets' padded copies and averaged pieces go in and the state's copies
  // run in (null: the host's), and the gradient ring's slots (null: none).
  virtual const MemoryPort* memory() const = 0;
  virtual const RingSlots* ring() const { return nullptr; }
  // The rank's whole flat parameters where the collectives take them (levels 1, 2; level 3:
  // at construction), one a gradient buffer of the same layout and type, and the stream the
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
  // The whole float32 parameters (levels 1, 2) out to the host and in from it, as a replica
  // that keeps them whole does.
  virtual std::vector<float> whole_params() = 0;
  virtual void set_whole_params(const float* host) = 0;
  // Whatever still reads the parameters' pieces (level 3's layer gathers), finished and
  // forgotten: before the pieces are read out or replaced.
  virtual void settle() {}
  // A gather wrote the whole parameters (the device's low-precision copy follows them).
  virtual void params_gathered() {}
};

class ShardedState {
 public:
  // `ddp`'s buckets cut into this rank's pieces at `level` as `cut` says (from now on, 2 and
  // 3, the Reducer reduce-scatters through them) in `home`'s memory; level 3 takes this rank's
  // pieces of the home's parameters (the home then frees its whole ones), its layer gathers on
  // `gathers` (null: the Reducer's communicator).
  ShardedState(Reducer& ddp, int level, ShardHome& home, Communicator* gathers, ShardCut cut = {});

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
  // Level 3, collective: every rank's pieces gathered into `whole` (one a buffer, the home's
  // memory), as the parameters are before a forward that uses them whole.
  void gather_params(const std::vector<void*>& whole);

  // Collective over the group: the whole parameters (`count`, the rank's flat layout) on the
  // host; and this rank's pieces set from a whole host copy (every rank gives the same). One
  // float32 buffer.
  std::vector<float> params(size_t count);
  void set_params(const float* host);
  // Collective: each of the optimizer's state `buffers` (this rank's pieces, in the home's
  // memory) gathered whole (`count` each) on the host; and a whole state cut into this rank's
  // pieces, for the optimizer to take. One float32 buffer.
  NamedState optimizer_state(size_t count,
                             const std::vector<std::pair<std::string, const float*>>& buffers);
  NamedState pieces_of(const NamedState& whole) const;

 private:
  ShardHome& home_;
  MemoryPort memory_;  // the home's, or the host's
  std::unique_ptr<ShardedBuckets> shards_;
  std::vector<std::shared_ptr<void>> pieces_;  // level 3: each buffer's
};

}  // namespace ddp
