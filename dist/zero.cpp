// plan_shards: equal padded pieces of every bucket.
#include "dist/zero.h"

#include <algorithm>

#include "runtime/error.h"

namespace ddp {

size_t ShardPlan::owned() const {
  size_t n = 0;
  for (const ShardPart& p : parts)
    n += p.count;
  return n;
}

ShardPlan plan_shards(const std::vector<Bucket>& buckets, int ranks, int rank, size_t align) {
  DDP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && align >= 1, "shards: rank {} of {}", rank,
            ranks);
  ShardPlan plan;
  plan.ranks = ranks;
  plan.rank = rank;
  for (const Bucket& b : buckets) {
    ShardPart p;
    p.bucket_offset = b.offset;
    p.bucket_count = b.count;
    const size_t per_rank = (b.count + ranks - 1) / ranks;
    p.piece = (per_rank + align - 1) / align * align;
    const size_t begin = std::min(b.count, p.piece * rank);
    const size_t end = std::min(b.count, p.piece * (rank + 1));
    p.offset = b.offset + begin;
    p.count = end - begin;
    p.shard_at = plan.shard_count;
    plan.shard_count += p.piece;
    plan.parts.push_back(p);
  }
  return plan;
}

}  // namespace ddp
