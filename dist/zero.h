// Sharded optimizer state and gradients over a data-parallel group (ZeRO stages 1 and 2, as
// DeepSpeed and PyTorch's ZeroRedundancyOptimizer / FSDP shard them), cut by one of two
// partitioners over the same buckets (dist/ddp.h):
// - equal pieces (plan_shards, ddptrain's): each bucket cut into D equal pieces, padded to a
//   multiple of `align` elements; rank r owns piece r of every bucket;
// - whole layers (plan_owned_shards, LibTorch's: the user's optimizer steps whole tensors):
//   each layer owned by one rank; rank r's layers in a bucket are its runs there, packed one
//   after the other into its piece, which is as large as the largest rank's share.
// Either way a rank's shard is about 1/D of every bucket and of the model, a bucket's
// reduce-scatter and all-gather move D equal pieces (as NCCL's and Gloo's collectives need),
// a rank keeps the optimizer state of its pieces only and updates only them, and the updated
// pieces are all-gathered back into every rank's whole parameters.
#pragma once

#include <cstddef>
#include <vector>

#include "dist/buckets.h"

namespace ddp {

// The pieces' alignment on the device (elements: 256 bytes of float32), as NCCL moves them best.
constexpr size_t kDeviceShardAlign = 64;

// A run of a bucket that one rank owns: `count` elements at `offset` of the bucket's buffer,
// at `at` of that rank's piece.
struct ShardRun {
  size_t offset = 0;  // where it starts in the buffer (elements)
  size_t count = 0;   // its elements
  size_t at = 0;      // where it lies in its rank's piece
};

// One bucket's pieces, and rank `rank`'s part of them.
struct ShardPart {
  size_t buffer = 0;         // the bucket's gradient buffer (Bucket::buffer)
  size_t bucket_offset = 0;  // where the bucket starts in its buffer (elements)
  size_t bucket_count = 0;   // the bucket's elements
  size_t piece = 0;          // every rank's piece of it (padded: piece x D >= bucket_count)
  size_t offset = 0;         // where this rank's (first) run starts in the buffer
  size_t count = 0;          // what this rank owns of it (< piece at the bucket's end, 0 past)
  size_t shard_at = 0;       // where its piece starts in the rank's shard of the buffer
  std::vector<std::vector<ShardRun>> runs;  // each rank's runs, in the buffer's order
  // Averaged by the all-reduce and sent from each owner by broadcasts, not in equal pieces:
  // whole layers whose owners' shares of the bucket are too uneven (one layer alone, say)
  // for pieces padded to the largest share to cost less on the wire.
  bool whole = false;
  // Whether each rank's runs are one run at piece x rank of the bucket (clamped to it), so
  // that one copy of the bucket lays every piece out (equal pieces always are).
  bool strided() const;
  // Whether the pieces are the bucket itself (strided, piece x D == bucket_count).
  bool in_place() const;
};

// A rank's pieces of every bucket.
struct ShardPlan {
  int ranks = 1;                     // D, the data-parallel ranks
  int rank = 0;                      // this rank's index among them
  std::vector<ShardPart> parts;      // one a bucket, in the buckets' order
  std::vector<size_t> shard_counts;  // each buffer's shard (its pieces' total, padded; a
                                     // whole part's space is this rank's runs only)
  size_t shard_count = 0;            // the pieces' total over every buffer (elements)
  size_t owned() const;              // the elements this rank owns
};

// The pieces of `buckets` for rank `rank` of `ranks`, each piece a multiple of `align`
// elements. Pure.
ShardPlan plan_shards(const std::vector<Bucket>& buckets, int ranks, int rank, size_t align = 16);

// Owners for whole layers of `sizes[j]` bytes (the reducer's numbering): each bucket's layers,
// the largest first, each to the rank that holds the least of that bucket so far (ties: the
// least of the model), so that a bucket of several layers is split about evenly and buckets of
// one layer each take turns; every rank's share of the model comes within the largest layer of
// an even one. Pure.
std::vector<int> balanced_owners(const std::vector<Bucket>& buckets,
                                 const std::vector<size_t>& sizes, int ranks);

// The pieces of `buckets` for rank `rank` of `ranks` where layer j (of counts[j] elements) is
// owned whole by owners[j]: a rank's piece of a bucket is its layers there, packed; the piece
// is the largest rank's, rounded up to `align`; a bucket where that piece times the ranks
// passes 1.5 times the bucket is `whole`. Pure.
ShardPlan plan_owned_shards(const std::vector<Bucket>& buckets, const std::vector<size_t>& counts,
                            const std::vector<int>& owners, int ranks, int rank, size_t align = 1);

}  // namespace ddp
