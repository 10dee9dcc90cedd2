// plan_shards: equal padded pieces of every bucket; plan_owned_shards: whole layers to owners.
#include "dist/zero.h"

#include <algorithm>

#include "runtime/error.h"

namespace ddp {

namespace {

size_t round_up(size_t n, size_t align) {
  return (n + align - 1) / align * align;
}

// Rank `rank`'s part of `p`, with p.runs and p.piece set, placed at the end of its buffer's
// shard in `plan`: a piece of p.piece elements, or of a whole part only this rank's runs (its
// owners send them from the whole buffer; nothing is gathered into a piece), rounded up to
// `align`.
void add_part(ShardPlan& plan, ShardPart p, size_t align) {
  const std::vector<ShardRun>& mine = p.runs[static_cast<size_t>(plan.rank)];
  p.offset = mine.empty() ? p.bucket_offset + p.bucket_count : mine.front().offset;
  p.count = 0;
  for (const ShardRun& run : mine)
    p.count += run.count;
  if (plan.shard_counts.size() <= p.buffer) plan.shard_counts.resize(p.buffer + 1, 0);
  p.shard_at = plan.shard_counts[p.buffer];
  const size_t space = p.whole ? round_up(p.count, align) : p.piece;
  plan.shard_counts[p.buffer] += space;
  plan.shard_count += space;
  plan.parts.push_back(std::move(p));
}

// A plan for rank `rank` of `ranks` with no part yet.
ShardPlan empty_plan(int ranks, int rank, size_t align) {
  DDP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && align >= 1, "shards: rank {} of {}", rank,
            ranks);
  ShardPlan plan;
  plan.ranks = ranks;
  plan.rank = rank;
  return plan;
}

// Bucket `b`'s part with no run yet.
ShardPart part_of(const Bucket& b, int ranks) {
  ShardPart p;
  p.buffer = b.buffer;
  p.bucket_offset = b.offset;
  p.bucket_count = b.count;
  p.runs.resize(static_cast<size_t>(ranks));
  return p;
}

}  // namespace

bool ShardPart::strided() const {
  for (size_t r = 0; r < runs.size(); ++r) {
    const size_t expected = std::min(bucket_count, piece * r);
    if (runs[r].size() > 1) return false;
    if (runs[r].size() == 1 && runs[r][0].offset != bucket_offset + expected) return false;
  }
  return true;
}

bool ShardPart::in_place() const {
  return piece * runs.size() == bucket_count && strided();
}

size_t ShardPlan::owned() const {
  size_t n = 0;
  for (const ShardPart& p : parts)
    n += p.count;
  return n;
}

ShardPlan plan_shards(const std::vector<Bucket>& buckets, int ranks, int rank, size_t align) {
  ShardPlan plan = empty_plan(ranks, rank, align);
  for (const Bucket& b : buckets) {
    ShardPart p = part_of(b, ranks);
    p.piece = round_up((b.count + ranks - 1) / ranks, align);
    for (size_t r = 0; r < p.runs.size(); ++r) {
      const size_t begin = std::min(b.count, p.piece * r);
      const size_t end = std::min(b.count, p.piece * (r + 1));
      if (end > begin) p.runs[r].push_back({b.offset + begin, end - begin, 0});
    }
    add_part(plan, std::move(p), align);
  }
  return plan;
}

std::vector<int> balanced_owners(const std::vector<Bucket>& buckets,
                                 const std::vector<size_t>& sizes, int ranks) {
  DDP_CHECK(ranks >= 1, "owners over {} ranks", ranks);
  std::vector<int> owners(sizes.size(), 0);
  std::vector<size_t> model(static_cast<size_t>(ranks), 0);  // each rank's bytes so far
  for (const Bucket& b : buckets) {
    std::vector<size_t> layers;
    for (int layer = b.first_layer; layer <= b.last_layer; ++layer)
      layers.push_back(static_cast<size_t>(layer));
    std::stable_sort(layers.begin(), layers.end(),
                     [&sizes](size_t x, size_t y) { return sizes.at(x) > sizes.at(y); });
    std::vector<size_t> bucket(static_cast<size_t>(ranks), 0);  // each rank's share of it
    for (const size_t j : layers) {
      size_t best = 0;
      for (size_t r = 1; r < bucket.size(); ++r)
        if (bucket[r] < bucket[best] || (bucket[r] == bucket[best] && model[r] < model[best]))
          best = r;
      owners[j] = static_cast<int>(best);
      bucket[best] += sizes[j];
      model[best] += sizes[j];
    }
  }
  return owners;
}

ShardPlan plan_owned_shards(const std::vector<Bucket>& buckets, const std::vector<size_t>& counts,
                            const std::vector<int>& owners, int ranks, int rank, size_t align) {
  DDP_CHECK(owners.size() == counts.size(), "owned shards: {} owners for {} layers", owners.size(),
            counts.size());
  ShardPlan plan = empty_plan(ranks, rank, align);
  for (const Bucket& b : buckets) {
    ShardPart p = part_of(b, ranks);
    std::vector<size_t> share(static_cast<size_t>(ranks), 0);
    size_t offset = b.offset;
    for (int layer = b.first_layer; layer <= b.last_layer; ++layer) {
      const auto j = static_cast<size_t>(layer);
      const int o = owners.at(j);
      DDP_CHECK(o >= 0 && o < ranks, "owned shards: layer {} owned by rank {} of {}", j, o, ranks);
      std::vector<ShardRun>& runs = p.runs[static_cast<size_t>(o)];
      const size_t at = share[static_cast<size_t>(o)];
      if (!runs.empty() && runs.back().offset + runs.back().count == offset)
        runs.back().count += counts[j];  // the rank's previous layer: one run
      else
        runs.push_back({offset, counts[j], at});
      share[static_cast<size_t>(o)] += counts[j];
      offset += counts[j];
    }
    DDP_CHECK(offset == b.offset + b.count,
              "owned shards: bucket {}+{} holds {} elements of layers", b.offset, b.count,
              offset - b.offset);
    const size_t largest = *std::max_element(share.begin(), share.end());
    p.piece = round_up(std::max<size_t>(1, largest), align);
    p.whole = largest * static_cast<size_t>(ranks) * 2 > b.count * 3;
    add_part(plan, std::move(p), align);
  }
  return plan;
}

}  // namespace ddp
