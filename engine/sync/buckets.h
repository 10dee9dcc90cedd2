// Gradient buckets: a model's layers as spans of one flat buffer (ParamSpan), cut into buckets
// (contiguous ranges, last layers first) that one collective each averages. Pure; what Ddp
// reduces and ZeRO shards. Knows no model.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/param_span.h"

namespace ddp {

// A range of layers whose gradients are averaged by one collective.
struct Bucket {
  size_t offset = 0;    // elements from the start of the flat gradient buffer
  size_t count = 0;     // elements
  int first_layer = 0;  // lowest layer whose gradients it holds
  int last_layer = 0;   // highest
};

// Buckets of about bucket_bytes (the first, holding the last layers, of about
// first_bucket_bytes so that communication starts early), walking layers from the last to
// the first; a layer is never split. Pure.
std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, size_t bucket_bytes,
                                 size_t first_bucket_bytes);

// How Ddp buckets and overlaps, in ddptrain's flags' units.
struct DdpOptions {
  double bucket_mb = 25;       // --bucket-mb: a bucket's size (MiB)
  double first_bucket_mb = 1;  // --first-bucket-mb: the first (last layers) one's
  bool overlap = true;         // start each bucket's all-reduce as soon as its layers are done
};

// plan_buckets with the flags' sizes (as Ddp cuts them).
std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, const DdpOptions& options);

}  // namespace ddp
