// --overlap-optimizer on the GPU: the optimizer on each range of parameters as soon as
// backward (and its all-reduce) is done with it, on a side stream.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/ddp.h"
#include "models/mlp_cuda.h"
#include "runtime/device_buffer.h"

namespace ddp {

// The optimizer overlapped with backward (and with the gradient all-reduces): each range of
// parameters (a data-parallel bucket, or a layer on one GPU) is updated on a side stream as
// soon as backward no longer reads it (every layer of the range has its weight and input
// gradients: the hook of the next lower layer, or the end of backward) and, with data
// parallelism, its average is in place. The ranges' updates are the same elementwise
// arithmetic as one pass over the buffer: the weights are bitwise those of the plain
// optimizer. The side stream joins stream() again before the step ends.
class OptimizerOverlap {
 public:
  struct Range {
    size_t offset = 0, count = 0;  // parameters (elements of the flat buffers)
    int first_layer = 0;           // lowest layer in the range
  };
  // `ranges` in the order backward finishes them (last layers first); with `ddp`, its
  // buckets in its order.
  OptimizerOverlap(CudaMlp& model, std::vector<Range> ranges, Ddp* ddp)
      : model_(model), ranges_(std::move(ranges)), ddp_(ddp), ready_(ranges_.size()) {
    model_.set_optimizer_in_hooks(true);
  }
  static std::vector<Range> of_layers(const MlpShape& shape) {
    std::vector<Range> ranges;
    const std::vector<ParamSpan> spans = param_spans(shape);
    for (int i = shape.num_layers() - 1; i >= 0; --i)
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
  // From the layer hook (after Ddp::layer_done): layers above `layer` are done.
  void layer_done(int layer) {
    while (next_ < ranges_.size() && ranges_[next_].first_layer > layer &&
           (ddp_ == nullptr || next_ < ddp_->issued()))
      apply(next_++);
  }
  // After backward (and Ddp::end_backward): the rest, then the side stream joins stream().
  void end_backward() {
    while (next_ < ranges_.size())
      apply(next_++);
    if (ddp_ != nullptr) ddp_->finish(side_.get());
    DDP_CUDA_CHECK(cudaEventRecord(joined_.get(), side_.get()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(model_.stream(), joined_.get(), 0));
  }

 private:
  void apply(size_t i) {
    DDP_CUDA_CHECK(cudaEventRecord(ready_[i].get(), model_.stream()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), ready_[i].get(), 0));
    if (ddp_ != nullptr) ddp_->pending(i).then_on(side_.get());
    model_.optimizer_range(ranges_[i].offset, ranges_[i].count, side_.get());
  }

  CudaMlp& model_;
  std::vector<Range> ranges_;
  Ddp* ddp_;
  std::vector<CudaEvent> ready_;  // one per range: backward is done with it
  CudaEvent joined_;
  CudaStream side_;
  size_t next_ = 0;
};
}  // namespace ddp
