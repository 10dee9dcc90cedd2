// Sharded optimizer state and gradients over a data-parallel group (ZeRO stages 1 and 2, as
// DeepSpeed and PyTorch's ZeroRedundancyOptimizer / FSDP shard them). Each gradient bucket
// (dist/ddp.h) is cut into D equal pieces, padded to a multiple of `align` elements; rank r
// owns piece r of every bucket, so its shard is about 1/D of every bucket and of the model,
// and a bucket's reduce-scatter and all-gather move equal pieces (as NCCL's and Gloo's
// collectives need). A rank keeps the optimizer state of its pieces only and updates only
// them; the updated pieces are all-gathered back into every rank's whole parameters.
#pragma once

#include <cstddef>
#include <vector>

#include "dist/buckets.h"

namespace ddp {

// The pieces' alignment on the device (elements: 256 bytes), as NCCL moves them best.
constexpr size_t kDeviceShardAlign = 64;

// Rank `rank`'s piece of one bucket.
struct ShardPart {
  size_t bucket_offset = 0;  // where the bucket starts in the flat buffer (elements)
  size_t bucket_count = 0;   // the bucket's elements
  size_t piece = 0;          // every rank's piece of it (padded: piece x D >= bucket_count)
  size_t offset = 0;         // where this rank's piece starts in the flat buffer
  size_t count = 0;          // what this rank owns of it (< piece at the bucket's end, 0 past)
  size_t shard_at = 0;       // where its piece starts in the rank's shard (pieces in order)
};

// A rank's pieces of every bucket.
struct ShardPlan {
  int ranks = 1;                 // D, the data-parallel ranks
  int rank = 0;                  // this rank's index among them
  std::vector<ShardPart> parts;  // one a bucket, in the buckets' order
  size_t shard_count = 0;        // the pieces' total (padded): the shard's buffers' size
  size_t owned() const;          // the elements this rank owns
};

// The pieces of `buckets` for rank `rank` of `ranks`, each piece a multiple of `align`
// elements. Pure.
ShardPlan plan_shards(const std::vector<Bucket>& buckets, int ranks, int rank, size_t align = 16);

}  // namespace ddp
