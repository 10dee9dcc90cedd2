// StepWatchdog: bounds every host wait on GPU work that depends on other ranks. The trainer
// marks each enqueued step; a background thread polls the marks' events (no CUDA sync) and,
// when the GPU has made no progress for the timeout, calls on_stuck once (which aborts the
// communicator, so that NCCL kernels waiting for a dead or stopped peer return), as
// PyTorch's NCCL watchdog does. The host then gets the message from check() or wait_idle()
// instead of hanging in a stream synchronisation. Only built with CUDA.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "collectives/communicator.h"

namespace ddp {

class StepWatchdog {
 public:
  // on_stuck(step, seconds): called once, on the watchdog thread, with the first step whose
  // work did not complete; returns the message for the error. `timeout_s` counts from the
  // last progress (a completed mark), not from the enqueue, so deep queues are fine.
  StepWatchdog(cudaStream_t stream, double timeout_s,
               std::function<std::string(int64_t step, double seconds)> on_stuck);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  // Records an event on the stream after step `step`'s work (host, in stream order).
  void mark(int64_t step);
  // Blocks until every marked step has finished on the device (polling, so that it returns as
  // soon as they have); throws ddp::Error with the watchdog's message if it fired.
  void wait_idle();
  // Throws ddp::Error with the watchdog's message if it fired.
  void check() const;

 private:
  struct Mark {
    int64_t step;
    cudaEvent_t event;
    uint64_t id;  // events are reused; ids are not
  };
  void run();

  cudaStream_t stream_;
  double timeout_s_;
  std::function<std::string(int64_t, double)> on_stuck_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Mark> pending_;
  uint64_t next_id_ = 0;
  std::vector<cudaEvent_t> free_events_;
  std::string failure_;
  std::chrono::steady_clock::time_point last_progress_;  // a mark seen done, or idle
  bool stop_ = false;
  std::thread thread_;
};

// The trainers' on_stuck: names the stuck step through `comm` (describe_stuck, which asks
// the store which ranks never reached it), calls `abort` (every communicator of the job, so
// that NCCL kernels waiting for a dead peer return) and, since an abort can itself block, ends
// the process with the message if it is still running a grace period later, as PyTorch's NCCL
// watchdog tears its process down.
std::function<std::string(int64_t, double)> abort_on_stall(Communicator* comm,
                                                           std::function<void()> abort,
                                                           double timeout_s);

}  // namespace ddp
