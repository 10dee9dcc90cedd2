// plan_buckets.
#include "engine/sync/buckets.h"

#include <cmath>

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

std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, const DdpOptions& options) {
  DDP_USAGE_CHECK(options.bucket_mb > 0 && options.first_bucket_mb >= 0,
                  "DdpOptions: bucket_mb {} and first_bucket_mb {}: expected sizes above 0",
                  options.bucket_mb, options.first_bucket_mb);
  return plan_buckets(layers, static_cast<size_t>(options.bucket_mb * 1048576),
                      static_cast<size_t>(options.first_bucket_mb * 1048576));
}

}  // namespace ddp
