// The watchdog thread: polls the oldest pending mark every millisecond; completed marks are
// recycled; no progress for the timeout fires on_stuck once and then only drains.
#include "engine/runners/step_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

using Clock = std::chrono::steady_clock;

StepWatchdog::StepWatchdog(cudaStream_t stream, double timeout_s,
                           std::function<std::string(int64_t, double)> on_stuck)
    : stream_(stream), timeout_s_(timeout_s), on_stuck_(std::move(on_stuck)) {
  thread_ = std::thread([this] { run(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
  for (const Mark& m : pending_)
    cudaEventDestroy(m.event);
  for (cudaEvent_t e : free_events_)
    cudaEventDestroy(e);
}

void StepWatchdog::mark(int64_t step) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    }
  }
  if (event == nullptr) DDP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  DDP_CUDA_CHECK(cudaEventRecord(event, stream_));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({step, event, next_id_++});
  }
  changed_.notify_all();
}

void StepWatchdog::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) throw Error(failure_);
}

void StepWatchdog::wait_idle() {
  // The caller polls too, so that a finished step is seen at once rather than at the
  // watchdog's next poll (up to a millisecond later: a pipeline waits for every step).
  std::unique_lock<std::mutex> lock(mutex_);
  while (!pending_.empty() && failure_.empty()) {
    const Mark oldest = pending_.front();
    if (cudaEventQuery(oldest.event) != cudaErrorNotReady) {
      pending_.pop_front();
      free_events_.push_back(oldest.event);
      last_progress_ = Clock::now();
      continue;
    }
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  if (!failure_.empty()) throw Error(failure_);
}

void StepWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  last_progress_ = Clock::now();
  while (!stop_) {
    if (pending_.empty()) {
      changed_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      last_progress_ = Clock::now();  // idle time is not a stall
      continue;
    }
    const Mark oldest = pending_.front();
    lock.unlock();
    const cudaError_t state = cudaEventQuery(oldest.event);
    lock.lock();
    // wait_idle() may have taken it meanwhile.
    if (pending_.empty() || pending_.front().id != oldest.id) continue;
    if (state != cudaErrorNotReady) {
      // Done (or failed: the host's own check reports a CUDA error with its statement).
      pending_.pop_front();
      free_events_.push_back(oldest.event);
      last_progress_ = Clock::now();
      changed_.notify_all();
      continue;
    }
    const double stalled = std::chrono::duration<double>(Clock::now() - last_progress_).count();
    if (failure_.empty() && stalled >= timeout_s_) {
      lock.unlock();
      std::string message = on_stuck_(oldest.step, stalled);
      lock.lock();
      failure_ = std::move(message);
      changed_.notify_all();
    }
    changed_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop_; });
  }
}

std::function<std::string(int64_t, double)> abort_on_stall(Communicator* comm,
                                                           std::function<void()> abort,
                                                           double timeout_s) {
  return [comm, abort = std::move(abort), timeout_s](int64_t step, double seconds) {
    const std::string message = comm->describe_stuck(
        "training step", static_cast<uint64_t>(step),
        fmt::format("no progress on this GPU for {:.1f}s (--timeout {}); aborting the communicator",
                    seconds, timeout_s));
    spdlog::error("{}", message);
    const double grace = std::min(10.0, std::max(2.0, timeout_s / 2));
    std::thread([grace, message] {
      std::this_thread::sleep_for(std::chrono::duration<double>(grace));
      std::fprintf(stderr,
                   "ddptrain: error: %s; the process was still blocked %.0fs after the abort, "
                   "exiting\n",
                   message.c_str(), grace);
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
    abort();
    spdlog::info("communicator aborted after the stall at step {}", step);
    return message;
  };
}

}  // namespace ddp
