// Gradient buckets: a model's layers as spans of one flat buffer (ParamSpan), cut into buckets
// (contiguous ranges, last layers first) that one collective each averages. Pure; what Reducer
// reduces and ZeRO shards. Knows no model.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/param_span.h"

namespace ddp {

// A range of layers whose gradients are averaged by one collective.
struct Bucket {
  size_t offset = 0;    // elements from the start of its gradient buffer
  size_t count = 0;     // elements
  int first_layer = 0;  // lowest layer whose gradients it holds
  int last_layer = 0;   // highest
  size_t buffer = 0;    // its gradient buffer: 0 (one flat buffer), or its kind's (grouped)
};

// Buckets of about bucket_bytes (the first, holding the last layers, of about
// first_bucket_bytes so that communication starts early), walking layers from the last to
// the first; a layer is never split. Pure.
std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, size_t bucket_bytes,
                                 size_t first_bucket_bytes);

// Buckets over layers of several kinds (element types) that never mix kinds, as PyTorch's
// compute_bucket_assignment_by_size: walking the layers in the order their gradients are
// expected (`arrival`; empty: the last layer first), each kind fills a bucket of its own (its
// first of about first_bucket_bytes, then about bucket_bytes, in its own element bytes), and the
// buckets are reduced in the order that walk completes them. A reducer numbers the layers so
// that each bucket is a contiguous run (`order`) of its kind's gradient buffer (a kind's layers
// in that order, one after the other); with one kind and no arrival order that is the layers'
// own order and the buckets are plan_buckets'. Pure.
struct GroupedBuckets {
  std::vector<size_t> order;         // order[j]: the layer the reducer calls j
  std::vector<Bucket> buckets;       // over the layers so numbered, in reduction order (the highest
                                     // layers first); each a range of buffer `Bucket::buffer`
  std::vector<int> buffer_kinds;     // buffer b's kind (numbered as `order` first meets them)
  std::vector<size_t> buffer_sizes;  // and its elements
};

// GroupedBuckets of layers of `counts[i]` elements of kind `kinds[i]`, `element_bytes[i]`
// bytes each; `arrival`: every layer once, in the order backward writes their gradients (as a
// first step recorded it), or empty.
GroupedBuckets plan_grouped_buckets(const std::vector<size_t>& counts,
                                    const std::vector<int>& kinds,
                                    const std::vector<size_t>& element_bytes, size_t bucket_bytes,
                                    size_t first_bucket_bytes,
                                    const std::vector<size_t>& arrival = {});

// How Reducer buckets and overlaps, in ddptrain's flags' units.
struct DdpOptions {
  double bucket_mb = 25;       // --bucket-mb: a bucket's size (MiB)
  double first_bucket_mb = 1;  // --first-bucket-mb: the first (last layers) one's
  bool overlap = true;         // start each bucket's all-reduce as soon as its layers are done
};

// plan_buckets with the flags' sizes (as Reducer cuts them).
std::vector<Bucket> plan_buckets(const std::vector<ParamSpan>& layers, const DdpOptions& options);

// A stage's buckets, decided once from its layers and the options: the reducer (Reducer), the
// gradient ring and ZeRO's pieces are all cut from this one value, never planned again.
struct BucketPlan {
  std::vector<Bucket> buckets;  // in reduction order (the last layers first)
  int layer_count = 0;          // the layers they tile
  bool overlap = true;          // each bucket's all-reduce starts as soon as its layers are done
};
// plan_buckets over `layers` with `options`' sizes, as a BucketPlan (bad sizes: a UsageError).
BucketPlan make_bucket_plan(const std::vector<ParamSpan>& layers, const DdpOptions& options);

}  // namespace ddp
