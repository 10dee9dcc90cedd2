// --timeline on the GPU: the whole model's step's spans from CUDA events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "dist/ddp.h"
#include "engine/telemetry/timeline.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"
#include "runtime/step_graph.h"

namespace ddp {

// --timeline on the GPU: CUDA events inside the step (recorded by the captured graph at every
// replay) time the forward, each layer's backward, each gradient bucket's all-reduce (lane 1:
// NCCL's stream, beside backward), --zero 3's layer gathers (lane 2: their communicator's
// stream) and the optimizer with what it waited for. The host reads
// them after every step, so a run with it is slower: a diagnostic, like the CPU timeline.
class GpuTimeline {
 public:
  GpuTimeline(cudaStream_t stream, int layers, size_t buckets) : stream_(stream) {
    for (int i = 0; i < layers; ++i)
      layer_.emplace_back(true);  // timed (a default CudaEvent is not)
    for (size_t b = 0; b < buckets; ++b) {
      issued_.emplace_back(true);
      reduced_.emplace_back(true);
    }
  }

  // Outside the step (never captured): before each step runs (GpuRunner::run_step).
  void step_begins() {
    if (!anchored_) {  // host time of one event: every other is placed from it
      DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
      anchor_us_ = TimelineRecorder::now_us();
      DDP_CUDA_CHECK(cudaEventRecord(anchor_.get(), stream_));
      anchored_ = true;
    }
    DDP_CUDA_CHECK(cudaEventRecord(start_.get(), stream_));
    gathers_this_step_ = 0;
  }
  void step_ends(TimelineRecorder& recorder, int64_t step) {
    DDP_CUDA_CHECK(cudaEventRecord(end_.get(), stream_));
    DDP_CUDA_CHECK(cudaEventSynchronize(end_.get()));
    // A replayed step issues no gathers from the host: it has the captured step's.
    if (gathers_this_step_ > 0) gathers_ = gathers_this_step_;
    double gathered = 0;  // a gather starts once issued and the one before it is done
    for (size_t g = 0; g < gathers_; ++g) {
      const double start = std::max(at(gather_issued_[g]), gathered);
      gathered = at(gather_done_[g]);
      recorder.add(gather_scheduled_[g] ? SpanKind::kUnshard : SpanKind::kGather, step,
                   gather_layer_[g], start, gathered, 2);
    }
    const int last = static_cast<int>(layer_.size()) - 1;
    recorder.add(SpanKind::kForward, step, -1, at(start_), at(forward_));
    for (int i = last; i >= 0; --i)
      recorder.add(SpanKind::kLayerBackward, step, i, at(i == last ? forward_ : layer_[i + 1]),
                   at(layer_[i]));
    double previous = 0;
    for (size_t b = 0; b < reduced_.size(); ++b) {
      const double start = std::max(at(issued_[b]), previous);
      previous = at(reduced_[b]);
      recorder.add(SpanKind::kBucketAllReduce, step, static_cast<int>(b), start, previous, 1);
    }
    // From the end of backward: waiting for the reductions, then the update.
    recorder.add(SpanKind::kOptimizer, step, -1, at(layer_[0]), at(end_));
  }

  // Inside the step (captured into the graph after the first).
  void forward_done() { record(forward_, stream_); }
  void layer_done(int layer) { record(layer_[layer], stream_); }
  void bucket_issued(size_t bucket) { record(issued_[bucket], stream_); }
  // --zero 3: layer `layer`'s gather, just issued (its communicator starts it after the work
  // queued so far; `scheduled`: by the schedule's kUnshard, else at a use), its completion timed
  // on a stream of its own that joins the model's stream with the buckets'.
  void gather_issued(int layer, bool scheduled, Work& gather) {
    const size_t g = gathers_this_step_++;
    if (g == gather_issued_.size()) {
      gather_issued_.emplace_back(true);
      gather_done_.emplace_back(true);
      gather_layer_.push_back(layer);
      gather_scheduled_.push_back(scheduled);
    }
    gather_layer_[g] = layer;
    gather_scheduled_[g] = scheduled;
    record(gather_issued_[g], stream_);
    gather.then_on(gather_side_.get());
    record(gather_done_[g], gather_side_.get());
    gathering_ = true;
  }
  // After every bucket is issued: each one's completion, timed on a side stream that joins
  // the model's stream again.
  void buckets_issued(Reducer& ddp) {
    for (size_t b = 0; b < reduced_.size(); ++b) {
      ddp.pending(b).then_on(side_.get());
      record(reduced_[b], side_.get());
    }
    DDP_CUDA_CHECK(cudaEventRecord(joined_.get(), side_.get()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, joined_.get(), 0));
    if (gathering_) {
      DDP_CUDA_CHECK(cudaEventRecord(gathers_joined_.get(), gather_side_.get()));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, gathers_joined_.get(), 0));
    }
  }

 private:
  static void record(CudaEvent& event, cudaStream_t stream) { record_event(event.get(), stream); }
  double at(const CudaEvent& event) const {
    float ms = 0;
    DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_.get(), event.get()));
    return anchor_us_ + 1e3 * static_cast<double>(ms);
  }

  cudaStream_t stream_;
  CudaEvent anchor_{true}, start_{true}, forward_{true}, end_{true};
  std::deque<CudaEvent> layer_;             // after layer i's weight gradient
  std::deque<CudaEvent> issued_, reduced_;  // per bucket (deque: events do not move)
  CudaEvent joined_;
  CudaStream side_;
  // --zero 3's gathers of the step, in the order issued (deque: events do not move).
  std::deque<CudaEvent> gather_issued_, gather_done_;
  std::vector<int> gather_layer_;
  std::vector<bool> gather_scheduled_;
  size_t gathers_this_step_ = 0, gathers_ = 0;
  bool gathering_ = false;
  CudaEvent gathers_joined_;
  CudaStream gather_side_;
  double anchor_us_ = 0;
  bool anchored_ = false;
};

}  // namespace ddp
