// plan_buckets.
#include "engine/sync/buckets.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/error.h"

namespace ddp {

std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, size_t bucket_bytes,
                                 size_t first_bucket_bytes) {
  std::vector<Bucket> buckets;
  const int last = static_cast<int>(layers.size()) - 1;
  Bucket current;
  bool open = false;
  for (int i = last; i >= 0; --i) {
    const ParamSpan& layer = layers[static_cast<size_t>(i)];
    DDP_CHECK(i == last || layer.offset + layer.count == layers[static_cast<size_t>(i) + 1].offset,
              "layer {} (elements {} to {}) does not end where layer {} starts: the layers must "
              "tile one flat buffer in order",
              i, layer.offset, layer.offset + layer.count, i + 1);
    if (!open) {
      current = Bucket{layer.offset, 0, i, i};
      open = true;
    }
    current.offset = layer.offset;
    current.count += layer.count;
    current.first_layer = i;
    const size_t limit = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (current.count * sizeof(float) >= limit || i == 0) {
      buckets.push_back(current);
      open = false;
    }
  }
  return buckets;
}

GroupedBuckets plan_grouped_buckets(const std::vector<size_t>& counts,
                                    const std::vector<int>& kinds,
                                    const std::vector<size_t>& element_bytes, size_t bucket_bytes,
                                    size_t first_bucket_bytes) {
  DDP_CHECK(kinds.size() == counts.size() && element_bytes.size() == counts.size(),
            "plan_grouped_buckets: {} layers, {} kinds and {} element sizes", counts.size(),
            kinds.size(), element_bytes.size());
  // Each kind's open bucket (its layers, highest first) and whether it has closed one yet.
  struct Open {
    std::vector<size_t> layers;
    size_t bytes = 0;
    bool closed_one = false;
  };
  std::map<int, Open> open;
  std::vector<std::vector<size_t>> closed;  // each bucket's layers, highest first
  for (size_t i = counts.size(); i-- > 0;) {
    Open& bucket = open[kinds[i]];
    bucket.layers.push_back(i);
    bucket.bytes += counts[i] * element_bytes[i];
    if (bucket.bytes >= (bucket.closed_one ? bucket_bytes : first_bucket_bytes)) {
      closed.push_back(std::move(bucket.layers));
      bucket = Open{{}, 0, true};
    }
  }
  for (auto& [kind, bucket] : open)
    if (!bucket.layers.empty()) closed.push_back(std::move(bucket.layers));
  // Completed first by a backward from the last layer: the highest lowest layer first.
  std::stable_sort(closed.begin(), closed.end(),
                   [](const std::vector<size_t>& a, const std::vector<size_t>& b) {
                     return a.back() > b.back();
                   });
  // The reducer's numbering: the last bucket's layers lowest, each bucket's in their order.
  GroupedBuckets plan;
  size_t offset = 0;
  for (size_t b = closed.size(); b-- > 0;) {
    Bucket bucket{offset, 0, static_cast<int>(plan.order.size()), 0};
    for (size_t k = closed[b].size(); k-- > 0;) {
      plan.order.push_back(closed[b][k]);
      bucket.count += counts[closed[b][k]];
    }
    bucket.last_layer = static_cast<int>(plan.order.size()) - 1;
    offset += bucket.count;
    plan.buckets.insert(plan.buckets.begin(), bucket);
  }
  return plan;
}

std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, const DdpOptions& options) {
  DDP_USAGE_CHECK(options.bucket_mb > 0 && options.first_bucket_mb >= 0,
                  "DdpOptions: bucket_mb {} and first_bucket_mb {}: expected sizes above 0",
                  options.bucket_mb, options.first_bucket_mb);
  return plan_buckets(layers, static_cast<size_t>(options.bucket_mb * 1048576),
                      static_cast<size_t>(options.first_bucket_mb * 1048576));
}

}  // namespace ddp
