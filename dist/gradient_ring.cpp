// gradient_ring_applies, gradient_ring_slot and layer_buckets.
#include "dist/gradient_ring.h"

#include <algorithm>

#include "dist/zero.h"
#include "runtime/error.h"

namespace ddp {

DdpOptions sync_bucket_options(int zero, const DdpOptions& asked) {
  return zero == 3 ? DdpOptions{1e-12, 0, asked.overlap} : asked;
}

bool gradient_ring_applies(const RingLayout& layout) {
  return layout.zero >= 2 && gradient_ring_applies(layout.stages_on_rank, layout.micro_batches,
                                                   layout.overlap, layout.replicas);
}

bool gradient_ring_applies(int stages_on_rank, int micro_batches, bool overlap, int ranks) {
  return stages_on_rank == 1 && micro_batches == 1 && overlap && ranks >= 2;
}

size_t gradient_ring_slot(const std::vector<Bucket>& buckets, int ranks, size_t align,
                          size_t param_count) {
  const ShardPlan plan = plan_shards(buckets, ranks, 0, align);
  size_t slot = 0;
  for (const ShardPart& p : plan.parts)
    slot = std::max(slot, p.piece * static_cast<size_t>(ranks));
  if (slot * kGradientRingSlots + plan.shard_count >= param_count) return 0;
  return slot;
}

std::vector<size_t> layer_buckets(const std::vector<Bucket>& buckets,
                                  const std::vector<ParamSpan>& layers) {
  std::vector<size_t> bucket_of(layers.size(), 0);
  std::vector<bool> found(layers.size(), false);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int layer = buckets[b].first_layer;
    DDP_CHECK(layer >= 0 && static_cast<size_t>(layer) < layers.size() &&
                  buckets[b].last_layer == layer && buckets[b].offset == layers[layer].offset &&
                  buckets[b].count == layers[layer].count,
              "--zero 3: bucket {} (layers {}-{}) is not one layer", b, buckets[b].first_layer,
              buckets[b].last_layer);
    bucket_of[static_cast<size_t>(layer)] = b;
    found[static_cast<size_t>(layer)] = true;
  }
  for (size_t i = 0; i < layers.size(); ++i)
    DDP_CHECK(found[i], "--zero 3: layer {} is in no bucket", i);
  return bucket_of;
}

}  // namespace ddp
