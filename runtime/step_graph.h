// StepGraph: a training step captured once in a CUDA graph and replayed. The first run()
// calls `enqueue` eagerly (cuBLASLt's and the modules' lazy loading happen outside any
// capture), the second captures what it enqueues on `stream` and launches the graph, later
// ones launch the graph without calling `enqueue`. Not enabled: eager every time. Used by the
// whole model's runner and by a GPU pipeline stage's. Only for code built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace ddp {

// Records `event` on `stream`; inside a capture as an external node, so that every replay of
// the graph records it again (the timelines' events inside a captured step).
inline void record_event(cudaEvent_t event, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DDP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone)
    DDP_CUDA_CHECK(cudaEventRecord(event, stream));
  else
    DDP_CUDA_CHECK(cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal));
}

class StepGraph {
 public:
  enum class Ran { kEager, kCaptured, kReplayed };

  StepGraph() = default;
  ~StepGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  Ran run(cudaStream_t stream, bool enabled, const std::function<void()>& enqueue) {
    const bool first = runs_++ == 0;
    if (!enabled || first) {
      enqueue();
      return Ran::kEager;
    }
    Ran ran = Ran::kReplayed;
    if (exec_ == nullptr) {
      DDP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      enqueue();
      DDP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
      DDP_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
      ran = Ran::kCaptured;
    }
    DDP_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
    return ran;
  }
  int64_t runs() const { return runs_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  int64_t runs_ = 0;
};

// Microseconds a step of `steps` runs of `step` on `stream`, timed by events after three
// warm-ups (eager, captured, replayed): replays of its graph, or eager launches when not
// `captured`. Synchronises. For start-up checks and benchmarks, not for training.
inline double time_steps_us(cudaStream_t stream, int steps, bool captured,
                            const std::function<void()>& step) {
  StepGraph graph;
  for (int i = 0; i < 3; ++i)
    graph.run(stream, captured, step);
  CudaEvent start(true), end(true);
  DDP_CUDA_CHECK(cudaEventRecord(start.get(), stream));
  for (int i = 0; i < steps; ++i)
    graph.run(stream, captured, step);
  DDP_CUDA_CHECK(cudaEventRecord(end.get(), stream));
  DDP_CUDA_CHECK(cudaEventSynchronize(end.get()));
  float ms = 0;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), end.get()));
  return 1e3 * static_cast<double>(ms) / steps;
}

}  // namespace ddp
