// --overlap-optimizer on the GPU: the optimizer on each range of parameters as soon as
// backward (and its all-reduce) is done with it, on a side stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "dist/ddp.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace ddp {

// The optimizer overlapped with backward (and with the gradient all-reduces): each range of
// parameters (a data-parallel bucket, or a layer on one GPU) is updated on a side stream as
// soon as backward no longer reads it (every layer of the range has its weight and input
// gradients: the hook of the next lower layer, or the end of backward) and, with data
// parallelism, its average is in place. The ranges' updates are the same elementwise
// arithmetic as one pass over the buffer: the weights are bitwise those of the plain
// optimizer. The side stream joins the compute stream again at the end of backward. Used by
// the whole model's runner and by a pipeline stage's alike.
class OptimizerOverlap {
 public:
  struct Range {
    size_t offset = 0, count = 0;  // parameters (elements of the flat buffers)
    int first_layer = 0;           // lowest layer in the range
  };
  // The optimizer on parameters [offset, offset + count) on a stream, with the step's
  // scalars (the model's or the stage's optimizer_range).
  using Update = std::function<void(size_t offset, size_t count, cudaStream_t stream)>;
  // `ranges` in the order backward finishes them (last layers first); with `ddp`, its
  // buckets in its order. `compute`: the stream backward runs on.
  OptimizerOverlap(cudaStream_t compute, Update update, std::vector<Range> ranges, Reducer* ddp)
      : compute_(compute),
        update_(std::move(update)),
        ranges_(std::move(ranges)),
        ddp_(ddp),
        ready_(ranges_.size()) {}
  // One range a layer, the last layer first: `spans[i]` is layer i's (offsets into the
  // buffer the update works on).
  static std::vector<Range> of_layers(const std::vector<ParamSpan>& spans) {
    std::vector<Range> ranges;
    for (int i = static_cast<int>(spans.size()) - 1; i >= 0; --i)
      ranges.push_back({spans[i].offset, spans[i].count, i});
    return ranges;
  }
  static std::vector<Range> of_buckets(const std::vector<Bucket>& buckets) {
    std::vector<Range> ranges;
    for (const Bucket& b : buckets)
      ranges.push_back({b.offset, b.count, b.first_layer});
    return ranges;
  }

  void begin_step() { next_ = 0; }
  // From the layer hook (after Reducer::layer_done): layers above `layer` are done.
  void layer_done(int layer) {
    while (next_ < ranges_.size() && ranges_[next_].first_layer > layer &&
           (ddp_ == nullptr || next_ < ddp_->issued()))
      apply(next_++);
  }
  // After backward (and Reducer::end_backward): the rest, then the side stream joins the compute
  // stream (apply_rest, then join; a pipeline stage joins later, at its optimizer step, so
  // that its last gradient's send does not wait for the updates).
  void end_backward() {
    apply_rest();
    join();
  }
  void apply_rest() {
    while (next_ < ranges_.size())
      apply(next_++);
  }
  void join() {
    if (ddp_ != nullptr) ddp_->finish(side_.get());
    DDP_CUDA_CHECK(cudaEventRecord(joined_.get(), side_.get()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, joined_.get(), 0));
  }

 private:
  void apply(size_t i) {
    DDP_CUDA_CHECK(cudaEventRecord(ready_[i].get(), compute_));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), ready_[i].get(), 0));
    if (ddp_ != nullptr) ddp_->pending(i).then_on(side_.get());
    update_(ranges_[i].offset, ranges_[i].count, side_.get());
  }

  cudaStream_t compute_;
  Update update_;
  std::vector<Range> ranges_;
  Reducer* ddp_;
  std::vector<CudaEvent> ready_;  // one per range: backward is done with it
  CudaEvent joined_;
  CudaStream side_;
  size_t next_ = 0;
};
}  // namespace ddp
