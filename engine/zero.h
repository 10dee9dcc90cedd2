// Sharded optimizer state and gradients over a data-parallel group (ZeRO stages 1 and 2, as
// DeepSpeed and PyTorch's ZeroRedundancyOptimizer / FSDP shard them). Each gradient bucket
// (engine/ddp.h) is cut into D equal pieces, padded to a multiple of `align` elements; rank r
// owns piece r of every bucket, so its shard is about 1/D of every bucket and of the model,
// and a bucket's reduce-scatter and all-gather move equal pieces (as NCCL's and Gloo's
// collectives need). A rank keeps the optimizer state of its pieces only and updates only
// them; the updated pieces are all-gathered back into every rank's whole parameters.
#pragma once

#include <cstddef>
#include <vector>

namespace ddp {

struct Bucket;  // engine/ddp.h

// The pieces' alignment on the device (elements: 256 bytes), as NCCL moves them best.
constexpr size_t kDeviceShardAlign = 64;

// Rank `rank`'s piece of one bucket.
struct ShardPart {
  size_t bucket_offset = 0;  // the bucket: elements [bucket_offset, + bucket_count) of the
  size_t bucket_count = 0;   // flat buffer
  size_t piece = 0;          // every rank's piece of it (padded: piece x D >= bucket_count)
  size_t offset = 0;         // what this rank owns: [offset, offset + count) of the flat
  size_t count = 0;          // buffer (count < piece at the bucket's end, 0 past it)
  size_t shard_at = 0;       // where its piece starts in the rank's shard (pieces in order)
};

struct ShardPlan {
  int ranks = 1;
  int rank = 0;
  std::vector<ShardPart> parts;  // one a bucket, in the buckets' order
  size_t shard_count = 0;        // the pieces' total (padded): the shard's buffers' size
  size_t owned() const;          // the elements this rank owns
};

// The pieces of `buckets` for rank `rank` of `ranks`, each piece a multiple of `align`
// elements. Pure.
ShardPlan plan_shards(const std::vector<Bucket>& buckets, int ranks, int rank, size_t align = 16);

}  // namespace ddp
