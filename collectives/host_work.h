// Host backends run every operation, in call order, on one background thread per
// communicator, so that an asynchronous all-reduce overlaps the caller's compute. A
// HostWork is the future of one queued operation.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "collectives/communicator.h"

namespace ddp {

class OperationQueue {
 public:
  OperationQueue();
  ~OperationQueue();  // finishes queued operations, then joins
  OperationQueue(const OperationQueue&) = delete;
  OperationQueue& operator=(const OperationQueue&) = delete;
  std::future<void> submit(std::function<void()> operation);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

// Waits for a queued operation; on timeout `on_timeout` builds the error message.
class HostWork final : public Work {
 public:
  HostWork(std::future<void> future, std::function<std::string(const std::string&)> describe)
      : future_(std::move(future)), describe_(std::move(describe)) {}
  void wait(double timeout_s) override;
  void then_on(void*) override { wait(300.0); }
  bool is_completed() override {
    return done_ || future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::future<void> future_;
  std::function<std::string(const std::string&)> describe_;
  bool done_ = false;
};

}  // namespace ddp
