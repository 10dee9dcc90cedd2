// What gradient sync asks of a runner's parameters (GradSync, dist/grad_sync.h): the
// buckets they are reduced in, their memory for the replicas' broadcast, the model check over
// that memory, and the state they are kept in from set-up on, whole or sharded (--zero), which
// the store makes over its own memory (engine/zero: the CPU's flat vectors, the GPU's
// DeviceParameters). The runner reads its parameters through the store; it names no ZeRO.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/communicator.h"
#include "dist/buckets.h"
#include "dist/ddp.h"
#include "dist/zero.h"

namespace ddp {

class ParamStore {
 public:
  virtual ~ParamStore() = default;

  // The buckets of the rank's stages (planned once, when the store was made): the Reducer's.
  virtual const BucketPlan& bucket_plan() const = 0;
  // The flat parameters where the group's communicator takes them (host or device memory)
  // and how many; params_changed() after something wrote them there (a broadcast).
  virtual float* params() = 0;
  virtual size_t count() const = 0;
  virtual void params_changed() = 0;
  // Makes `ddp` reach this memory (the GPU: its stream, the device copies, --grad-reduce
  // bf16's wire) and checks, collectively, that every replica holds the same model:
  // `fingerprint` identifies it, `description` names it in the error ("--layers 12,8,4").
  virtual void join(Reducer& ddp, uint64_t fingerprint, const std::string& description) = 0;
  // From now on the optimizer state (1), the averaged gradients (2) and the parameters (3) are
  // kept as this rank's pieces of `ddp`'s buckets (the gathers of level 3 on `gathers`, null:
  // the Reducer's communicator). Returns the pieces.
  virtual const ShardPlan& shard(Reducer& ddp, int level, Communicator* gathers) = 0;
};

}  // namespace ddp
