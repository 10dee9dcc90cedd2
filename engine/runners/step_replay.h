// StepReplay: how a GPU runner's steps reach the device. Each step's work is enqueued once
// (eager), captured in a CUDA graph at the second step and replayed after (StepGraph); with
// peers every host wait on the stream is bounded by the step watchdog (StepWatchdog: a dead
// or stopped rank fails the others within --timeout, naming it); and the host waits where it
// must: for the first step (its time is reported) and at the end of each chunk of steps. The
// host state a replayed step skips is the runner's to set before run(). Only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/runners/step_watchdog.h"
#include "runtime/step_graph.h"

namespace ddp {

class StepReplay {
 public:
  // The steps of `stream`; `whole_model`: the rank runs the whole model (no pipeline
  // neighbours), whose chunk's end is waited for by the caller's next synchronising call.
  StepReplay(cudaStream_t stream, bool whole_model) : stream_(stream), whole_model_(whole_model) {}

  // With peers: every wait bounded by `timeout_s`, `on_stuck` naming the step (abort_on_stall).
  void watch(double timeout_s, std::function<std::string(int64_t step, double seconds)> on_stuck);
  bool watched() const { return watchdog_ != nullptr; }

  // The next steps are [first, first + steps).
  void begin_chunk(int64_t first, int steps);
  // Step `step`'s place in the chunk (0 for its first); an error outside it.
  int64_t in_chunk(int64_t step) const;
  // Step `step` (of the chunk): `enqueue` run eagerly, captured or its graph replayed
  // (`capture`: whether the step may be captured at all); then the waits above.
  StepGraph::Ran run(int64_t step, bool capture, const std::function<void()>& enqueue);

  // Every step marked so far done on the device (bounded by the watchdog with peers; else
  // nothing to wait for here).
  void wait_idle();
  // Everything enqueued so far done (collectives bounded by the watchdog).
  void wait_stream();

 private:
  cudaStream_t stream_;
  bool whole_model_;
  std::unique_ptr<StepWatchdog> watchdog_;
  StepGraph graph_;  // the step, captured at the second and replayed
  int64_t chunk_first_ = 0, chunk_end_ = 0;
  int64_t steps_run_ = 0, last_step_ = 0;
};

}  // namespace ddp
