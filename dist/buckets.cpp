// plan_buckets.
#include "dist/buckets.h"

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
                                    size_t first_bucket_bytes, const std::vector<size_t>& arrival) {
  const size_t n = counts.size();
  DDP_CHECK(kinds.size() == n && element_bytes.size() == n,
            "plan_grouped_buckets: {} layers, {} kinds and {} element sizes", n, kinds.size(),
            element_bytes.size());
  std::vector<size_t> walk = arrival;
  if (walk.empty())
    for (size_t i = n; i-- > 0;)
      walk.push_back(i);
  std::vector<char> seen(n, 0);
  for (const size_t i : walk) {
    DDP_CHECK(i < n && !seen[i], "plan_grouped_buckets: the arrival order names layer {} {}", i,
              i < n ? "twice" : "out of range");
    seen[i] = 1;
  }
  DDP_CHECK(walk.size() == n, "plan_grouped_buckets: the arrival order has {} of the {} layers",
            walk.size(), n);
  // Each kind's open bucket (its layers, in arrival order) and whether it has closed one yet.
  struct Open {
    std::vector<size_t> layers;
    size_t bytes = 0;
    bool closed_one = false;
  };
  std::map<int, Open> open;
  // Each bucket's layers, and the walk's step at which it completes.
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;
  for (size_t step = 0; step < n; ++step) {
    const size_t i = walk[step];
    Open& bucket = open[kinds[i]];
    bucket.layers.push_back(i);
    bucket.bytes += counts[i] * element_bytes[i];
    if (bucket.bytes >= (bucket.closed_one ? bucket_bytes : first_bucket_bytes)) {
      closed.emplace_back(step, std::move(bucket.layers));
      bucket = Open{{}, 0, true};
    }
  }
  std::vector<size_t> position(n);
  for (size_t step = 0; step < n; ++step)
    position[walk[step]] = step;
  for (auto& [kind, bucket] : open)
    if (!bucket.layers.empty())
      closed.emplace_back(position[bucket.layers.back()], std::move(bucket.layers));
  std::stable_sort(closed.begin(), closed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  // The reducer's numbering: the last bucket's layers lowest, each bucket's in ascending order;
  // each kind's buffer holds its layers in that order.
  GroupedBuckets plan;
  for (size_t b = closed.size(); b-- > 0;) {
    std::vector<size_t> layers = closed[b].second;
    std::sort(layers.begin(), layers.end());
    const int kind = kinds[layers.front()];
    const auto found = std::find(plan.buffer_kinds.begin(), plan.buffer_kinds.end(), kind);
    const auto buffer = static_cast<size_t>(found - plan.buffer_kinds.begin());
    if (found == plan.buffer_kinds.end()) {
      plan.buffer_kinds.push_back(kind);
      plan.buffer_sizes.push_back(0);
    }
    Bucket bucket{plan.buffer_sizes[buffer], 0, static_cast<int>(plan.order.size()), 0, buffer};
    for (const size_t layer : layers) {
      plan.order.push_back(layer);
      bucket.count += counts[layer];
    }
    bucket.last_layer = static_cast<int>(plan.order.size()) - 1;
    plan.buffer_sizes[buffer] += bucket.count;
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

BucketPlan make_bucket_plan(const std::vector<ParamSpan>& layers, const DdpOptions& options) {
  return BucketPlan{plan_buckets(layers, options), static_cast<int>(layers.size()),
                    options.overlap};
}

}  // namespace ddp
