// The gradient sync's layout decisions, written once for every runner: --zero 2 and 3's
// gradient ring (which bucket writes into which slot, how large a slot is) and --zero 3's
// layer-to-bucket map (a bucket a layer, gathered before each use). Pure; the runners
// allocate the memory and carry out the copies on their own (host or device).
#pragma once

#include <cstddef>
#include <vector>

#include "dist/buckets.h"

namespace ddp {

// Where backward runs once a step and each bucket is reduce-scattered as soon as it is written
// (overlap), a bucket's gradients need a slot only until then. Three slots, so that a bucket's
// reduce-scatter has two buckets' backward to finish before its slot is written again; bucket
// b writes into slot b % kGradientRingSlots.
constexpr int kGradientRingSlots = 3;

// Whether a ring can hold a step's gradients: backward runs once a step (one stage a rank, one
// micro-batch: accumulation adds into the whole buffer), buckets start as soon as written
// (`overlap`), and there are `ranks` >= 2 to reduce-scatter over.
bool gradient_ring_applies(int stages_on_rank, int micro_batches, bool overlap, int ranks);

// What decides whether a stage's gradients go into a ring: --zero's level, overlap, and how
// backward runs (stages on the rank, micro-batches a step) over how many replicas. (The ring's
// slots are cut from the stage's BucketPlan.)
struct RingLayout {
  int zero = 0;
  bool overlap = true;
  int stages_on_rank = 1;
  int micro_batches = 1;
  int replicas = 1;
};
// gradient_ring_applies for `layout` at its --zero level (2 or 3).
bool gradient_ring_applies(const RingLayout& layout);

// A ring slot's size in elements over `buckets` (each padded to `ranks` pieces of a multiple
// of `align` elements, as plan_shards cuts them), or 0 where the ring would hold as much as
// the whole buffer of `param_count` elements (its slots and the averaged pieces together).
size_t gradient_ring_slot(const std::vector<Bucket>& buckets, int ranks, size_t align,
                          size_t param_count);

// The buckets gradient sync cuts at --zero `zero` from those `asked` (the flags'): --zero 3
// gathers a layer's parameters at a time, so a bucket a layer.
DdpOptions sync_bucket_options(int zero, const DdpOptions& asked);

// --zero 3: the bucket of each of `layers` (the rank's layers as spans of its flat buffer, in
// order), one bucket a layer; throws ddp::Error when a bucket is not exactly one layer.
std::vector<size_t> layer_buckets(const std::vector<Bucket>& buckets,
                                  const std::vector<ParamSpan>& layers);

}  // namespace ddp
