// DeviceBusySpans: events around a stage's compute, read back as costs and timeline spans.
#include "engine/telemetry/busy_spans.h"

#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/step_graph.h"

namespace ddp {

DeviceBusySpans::DeviceBusySpans(cudaStream_t stream, size_t most) : stream_(stream) {
  for (size_t i = 0; i < most; ++i) {
    start_.push_back(std::make_unique<CudaEvent>(true));
    end_.push_back(std::make_unique<CudaEvent>(true));
  }
  what_.resize(most);
}

void DeviceBusySpans::step_begins() {
  marks_ = 0;
  anchor_us_ = TimelineRecorder::now_us();
  DDP_CUDA_CHECK(cudaEventRecord(anchor_.get(), stream_));
}

void DeviceBusySpans::begin(SpanKind kind, int micro, int stage) {
  DDP_CHECK(static_cast<size_t>(marks_) < what_.size(),
            "busy spans: more than {} compute spans in one step", what_.size());
  what_[marks_] = {kind, micro, stage};
  record_event(start_[marks_]->get(), stream_);
}

void DeviceBusySpans::end() {
  record_event(end_[marks_++]->get(), stream_);
}

ComputeCosts DeviceBusySpans::costs() const {
  ComputeCosts costs;
  for (int i = 0; i < marks_; ++i) {
    float ms = 0;
    DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_[i]->get(), end_[i]->get()));
    costs.add(what_[i].kind, ms / 1e3);
  }
  return costs;
}

void DeviceBusySpans::add_to(TimelineRecorder& timeline, int64_t step, bool stages) const {
  for (int i = 0; i < marks_; ++i)
    timeline.add(what_[i].kind, step, what_[i].micro_batch, at(*start_[i]), at(*end_[i]), 0,
                 stages ? what_[i].stage : -1);
}

double DeviceBusySpans::at(const CudaEvent& event) const {
  float ms = 0;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_.get(), event.get()));
  return anchor_us_ + 1e3 * static_cast<double>(ms);
}

}  // namespace ddp
