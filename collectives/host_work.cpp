// OperationQueue and HostWork.
#include "collectives/host_work.h"

#include <chrono>

#include "runtime/error.h"

namespace ddp {

OperationQueue::OperationQueue() : thread_([this] { run(); }) {}

OperationQueue::~OperationQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

std::future<void> OperationQueue::submit(std::function<void()> operation) {
  std::packaged_task<void()> task(std::move(operation));
  std::future<void> future = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
  return future;
}

void OperationQueue::run() {
  while (true) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();  // exceptions land in the future
  }
}

void HostWork::wait(double timeout_s) {
  if (done_) return;
  if (future_.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready)
    throw Error(describe_(fmt::format("no completion within the {:.1f}s deadline", timeout_s)));
  done_ = true;
  try {
    future_.get();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(describe_(e.what()));
  }
}

}  // namespace ddp
