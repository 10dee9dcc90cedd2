// Gradient sync of a rank's stages over their replicas, set up in one place from its own
// options (SyncOptions, translated from ddptrain's flags at the edge): the buckets (one
// BucketPlan, --zero 3's bucket a layer said once where it overrides the flags), the Reducer over
// them, the model check, rank 0's parameters broadcast, and the state the parameters are kept
// in, whole or sharded, made by the runner's ReplicaStore. Knows no model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/buckets.h"
#include "dist/ddp.h"
#include "dist/gradient_ring.h"
#include "dist/param_store.h"
#include "dist/sync_options.h"

namespace ddp {

// The buckets gradient sync reduces over `layers` (a rank's layers as spans of its flat
// buffer, in order): the asked sizes, or a bucket a layer where layers are gathered. Pure.
BucketPlan plan_sync_buckets(const std::vector<ParamSpan>& layers, const SyncOptions& options);

// Whether a stage's gradients go into a ring (gradient_ring_applies) under `options`, with
// `stages_on_rank` stages on the rank, `micro_batches` a step and `replicas` replicas.
RingLayout sync_ring_layout(const SyncOptions& options, int stages_on_rank, int micro_batches,
                            int replicas);

// The model that every replica must hold alike (ReplicaStore::join).
struct ModelIdentity {
  uint64_t fingerprint = 0;
  std::string description;  // how the error names it: "--layers 12,8,4"
};

struct GradSync {
  // Data parallelism over `group` for the parameters in `store`: the Reducer over its buckets, the
  // model check (collective), rank 0's parameters broadcast and, with --zero, the sharded
  // state (its start-up line, and the override of the bucket sizes, from `lead`).
  // `gathers`: level 3's layer gathers' own communicator over the same group, or null.
  static std::unique_ptr<Reducer> make(Communicator& group, ReplicaStore& store,
                                       const SyncOptions& options, const ModelIdentity& model,
                                       bool lead, Communicator* gathers = nullptr);
};

}  // namespace ddp
