// Gradient sync's own options (GradSync, dist/grad_sync.h), translated from ddptrain's
// flags at the edge (sync_options in engine/config.h), so that neither sync nor the runners
// read the whole TrainConfig for them.
#pragma once

#include "dist/buckets.h"

namespace ddp {

// What gradient sync is asked to do (ddptrain's flags: --zero, --bucket-mb, --first-bucket-mb,
// --overlap, --grad-reduce, --nccl-symmetric, --zero-prefetch).
struct SyncOptions {
  int zero = 0;             // 0: every replica keeps the whole state; 1, 2, 3: sharded
  DdpOptions buckets;       // the buckets' sizes and overlap, as asked
  bool bf16_grads = false;  // the gradients cross the wire in bf16
  // GPU: the gradient buffer (and the bf16 wire copy) allocated by NCCL and registered as a
  // symmetric window of the data-parallel communicator (--nccl-symmetric)
  bool symmetric_memory = false;
  int zero_prefetch = 1;  // level 3 on the GPU: layers gathered ahead of the one in use
  // Whether a layer's parameters are gathered for each use (level 3): a bucket a layer.
  bool gathers_layers() const { return zero == 3; }
};

}  // namespace ddp
