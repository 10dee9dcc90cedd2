// A pipeline stage's compute on the GPU, span by span: each forward, backward and backward half
// of the step between two timed events on the compute stream, placed on the host's clock from
// an anchor event recorded while the stream was idle. Inside a captured step the events are
// recorded as external nodes, so every replay records them again. The costs by kind and the
// timeline's spans are read from them after the step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/telemetry/compute_costs.h"
#include "engine/telemetry/timeline.h"
#include "runtime/device_buffer.h"

namespace ddp {

class DeviceBusySpans {
 public:
  // At most `most` spans a step.
  DeviceBusySpans(cudaStream_t stream, size_t most);

  // Outside the step, with the stream idle: the anchor placed at the host's clock now.
  void step_begins();
  // Around one compute span of micro-batch `micro` of stage `stage` (in stream order).
  void begin(SpanKind kind, int micro, int stage);
  void end();
  // The step just run was captured (its spans are every replay's), or replayed.
  void captured() { captured_ = marks_; }
  void replayed() { marks_ = captured_; }

  // The last step's compute by kind (waits for its events).
  ComputeCosts costs() const;
  // Its spans into `timeline` as step `step`'s (`stages`: name each span's stage).
  void add_to(TimelineRecorder& timeline, int64_t step, bool stages) const;

 private:
  struct Span {
    SpanKind kind;
    int micro_batch;
    int stage;
  };
  double at(const CudaEvent& event) const;  // host microseconds

  cudaStream_t stream_;
  std::vector<std::unique_ptr<CudaEvent>> start_, end_;
  std::vector<Span> what_;
  CudaEvent anchor_{true};
  double anchor_us_ = 0;
  int marks_ = 0;     // spans recorded this step
  int captured_ = 0;  // and in the captured step
};

}  // namespace ddp
