// StepReplay: eager, captured or replayed steps, bounded by the watchdog.
#include "engine/runners/step_replay.h"

#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

void StepReplay::watch(double timeout_s,
                       std::function<std::string(int64_t step, double seconds)> on_stuck) {
  watchdog_ = std::make_unique<StepWatchdog>(stream_, timeout_s, std::move(on_stuck));
}

void StepReplay::begin_chunk(int64_t first, int steps) {
  chunk_first_ = first;
  chunk_end_ = first + steps;
}

int64_t StepReplay::in_chunk(int64_t step) const {
  DDP_CHECK(step >= chunk_first_ && step < chunk_end_, "step {} is outside the chunk [{}, {})",
            step, chunk_first_, chunk_end_);
  return step - chunk_first_;
}

StepGraph::Ran StepReplay::run(int64_t step, bool capture, const std::function<void()>& enqueue) {
  in_chunk(step);
  const StepGraph::Ran ran = graph_.run(stream_, capture, enqueue);
  last_step_ = step + 1;
  if (watchdog_) {
    watchdog_->mark(step + 1);
    watchdog_->check();
  }
  if (steps_run_++ == 0) {  // the first step is waited for: its time is reported
    wait_idle();
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else if (step + 1 == chunk_end_) {
    wait_idle();  // before any synchronising call at the chunk's end
    if (!whole_model_ && !watchdog_) DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return ran;
}

void StepReplay::wait_idle() {
  if (watchdog_) watchdog_->wait_idle();
}

void StepReplay::wait_stream() {
  if (watchdog_) {
    watchdog_->mark(last_step_);
    watchdog_->wait_idle();
  }
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace ddp
