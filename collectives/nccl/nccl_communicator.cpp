// NcclCommunicator. A group starts as a non-blocking communicator (its start can be
// abandoned at the deadline) and runs its operations on a blocking one split from it (a
// launch on the calling thread, as nccl-tests and PyTorch do; a non-blocking communicator
// hands every call to a new thread). Waits poll cudaEventQuery and ncclCommGetAsyncError
// against the deadline, a watchdog bounds the blocking host calls, and either aborts the
// communicator on error or timeout, so that no rank hangs. The ncclComm_t has one owner,
// NcclHandle, through which every path (a Work's wait, the communicator's abort(), a
// watchdog thread, the destructor) aborts it exactly once.
#include "collectives/nccl/nccl_communicator.h"

#include "collectives/backend_hooks.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"
#include "runtime/device_kernels.h"
#include "runtime/error.h"
#include "runtime/store.h"

namespace ddp {
namespace {

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

using Clock = std::chrono::steady_clock;

// Polls a non-blocking communicator until its pending call (init, split, enqueue) is done.
// The communicator's own state is asked even when the call returned ncclSuccess: a split
// is complete only once the parent leaves ncclInProgress (NCCL issue 1472).
ncclResult_t settle(ncclComm_t comm, ncclResult_t first, Clock::time_point deadline) {
  if (first != ncclSuccess && first != ncclInProgress) return first;
  ncclResult_t state = ncclInProgress;
  ncclCommGetAsyncError(comm, &state);
  while (state == ncclInProgress) {
    if (Clock::now() >= deadline) return ncclInProgress;
    std::this_thread::yield();
    ncclCommGetAsyncError(comm, &state);
  }
  return state;
}

// Aborts a communicator whose blocking host call (a first connection to a peer, a split, a
// finalise) outlives its deadline: a blocking NCCL call has no other way out when a peer is
// gone or stopped. Arming and disarming are two atomic stores, so every call can be guarded;
// the thread looks every 50 ms.
class HostWatchdog {
 public:
  explicit HostWatchdog(std::function<void()> on_expiry)
      : on_expiry_(std::move(on_expiry)), thread_([this] { loop(); }) {}
  ~HostWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  HostWatchdog(const HostWatchdog&) = delete;
  HostWatchdog& operator=(const HostWatchdog&) = delete;

  void arm(Clock::time_point deadline) {
    deadline_.store(deadline.time_since_epoch().count(), std::memory_order_release);
  }
  void disarm() { deadline_.store(0, std::memory_order_release); }
  bool fired() const { return fired_.load(std::memory_order_acquire); }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(50));
      const Clock::rep deadline = deadline_.load(std::memory_order_acquire);
      if (stop_ || deadline == 0 || fired()) continue;
      if (Clock::now().time_since_epoch().count() < deadline) continue;
      fired_.store(true, std::memory_order_release);
      lock.unlock();
      on_expiry_();
      lock.lock();
    }
  }

  std::function<void()> on_expiry_;
  std::atomic<Clock::rep> deadline_{0};  // 0: disarmed
  std::atomic<bool> fired_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The one owner of the ncclComm_t that runs the operations: a blocking communicator, so
// that a call launches on the calling thread (a non-blocking one starts a thread for every
// call, tens of microseconds each), guarded by a HostWatchdog. `bootstrap` (may be null) is
// the non-blocking communicator it was split from (initialisation there can be abandoned at
// a deadline), kept until `comm` is gone. abort() may be
// called from any thread, any number of times: each ncclCommAbort runs once. The
// destructor finalises a communicator that was not aborted (bounded: after 30 s, abort).
class NcclHandle {
 public:
  NcclHandle(ncclComm_t comm, ncclComm_t bootstrap)
      : comm_(comm), bootstrap_(bootstrap), watchdog_([this] { abort(); }) {}
  ~NcclHandle() {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    if (comm_ != nullptr && !aborted()) {
      if (guarded(deadline, [&] { return ncclCommFinalize(comm_); }) == ncclSuccess && !aborted())
        ncclCommDestroy(comm_);
      else
        abort();
    }
    if (bootstrap_ != nullptr && !aborted()) {
      if (settle(bootstrap_, ncclCommFinalize(bootstrap_), deadline) == ncclSuccess)
        ncclCommDestroy(bootstrap_);
      else
        abort();
    }
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  ncclComm_t get() const { return comm_; }
  // Polled by every wait: an atomic read, no lock.
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Whether the watchdog gave up on a blocking call.
  bool expired() const { return watchdog_.fired(); }
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load() || comm_ == nullptr) return;
    aborted_.store(true, std::memory_order_release);
    ncclCommAbort(comm_);
    if (bootstrap_ != nullptr) ncclCommAbort(bootstrap_);
  }
  // Runs a blocking NCCL call; the communicator is aborted if it is still running at
  // `deadline`.
  template <typename Call>
  ncclResult_t guarded(Clock::time_point deadline, Call call) {
    watchdog_.arm(deadline);
    const ncclResult_t r = call();
    watchdog_.disarm();
    return r;
  }

 private:
  ncclComm_t comm_;
  ncclComm_t bootstrap_;
  std::mutex mutex_;  // one abort at a time
  std::atomic<bool> aborted_{false};
  HostWatchdog watchdog_;  // last: its thread may call abort()
};

// Completion events, reused: creating one per operation costs microseconds on the host.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t event : free_)
      cudaEventDestroy(event);
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t event = free_.back();
        free_.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void give(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(event);
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// The blocking communicator that runs a group's operations, split from the non-blocking
// `bootstrap` (sharing its resources) so that its start could be abandoned at `deadline`.
std::shared_ptr<NcclHandle> make_blocking(ncclComm_t bootstrap, int rank,
                                          Clock::time_point deadline) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  // Not shared: NCCL shares a parent's resources (proxy, connections to each peer) with every
  // communicator split from it when the parent was made with splitShare; communicators that
  // share them must never run at once, and a pipeline's lanes and its data-parallel group,
  // all split from this one, do (zb-v's lanes stalled the first step, or took each other's
  // messages, when they shared).
  config.splitShare = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = settle(bootstrap, ncclCommSplit(bootstrap, 0, rank, &comm, &config), deadline);
  // The split completes on NCCL's thread, which sets `comm` last.
  auto made = [&] { return *static_cast<volatile ncclComm_t*>(&comm); };
  while (r == ncclSuccess && made() == nullptr && Clock::now() < deadline)
    std::this_thread::yield();
  comm = made();
  if (r != ncclSuccess || comm == nullptr) {
    ncclCommAbort(bootstrap);
    throw Error(
        fmt::format("NCCL: the blocking communicator could not be split from the "
                    "bootstrap one: {}",
                    r == ncclSuccess ? "timed out" : ncclGetErrorString(r)));
  }
  return std::make_shared<NcclHandle>(comm, bootstrap);
}

class NcclWork final : public Work {
 public:
  // `ended` (may be null): called once, when a wait or a poll first sees the work done.
  NcclWork(std::shared_ptr<NcclHandle> comm, std::shared_ptr<EventPool> events, cudaEvent_t done,
           std::function<std::string(const std::string&)> describe,
           std::function<void()> ended = nullptr)
      : comm_(std::move(comm)),
        events_(std::move(events)),
        done_(done),
        describe_(std::move(describe)),
        ended_(std::move(ended)) {}
  // `events` null: the event belongs to a captured graph and stays with the communicator.
  ~NcclWork() override {
    if (events_ != nullptr) events_->give(done_);
  }
  void wait(double timeout_s) override {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    while (true) {
      if (comm_->aborted()) {
        // Another path (a watchdog, an earlier failure) gave up on this communicator.
        throw Error(describe_("the communicator was aborted while this operation was pending"));
      }
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaSuccess) return seen_done();
      DDP_CHECK(state == cudaErrorNotReady, "{}", describe_(cudaGetErrorString(state)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_->get(), &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string message =
            describe_(fmt::format("NCCL error {} ({}); communicator aborted",
                                  ncclGetErrorString(async), ncclGetLastError(comm_->get())));
        comm_->abort();
        throw Error(message);
      }
      if (Clock::now() >= deadline) {
        const std::string message =
            describe_(fmt::format("no completion within the {:.1f}s deadline", timeout_s));
        comm_->abort();
        throw Error(message + "; communicator aborted");
      }
      std::this_thread::yield();
    }
  }
  void then_on(void* stream) override {
    DDP_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0));
  }
  // Done, or failed (wait() then says how).
  bool is_completed() override {
    if (comm_->aborted()) return true;
    const cudaError_t state = cudaEventQuery(done_);
    if (state == cudaSuccess) seen_done();
    return state != cudaErrorNotReady;
  }

 private:
  std::shared_ptr<NcclHandle> comm_;
  std::shared_ptr<EventPool> events_;
  void seen_done() {
    if (!ended_) return;
    ended_();
    ended_ = nullptr;
  }

  cudaEvent_t done_;
  std::function<std::string(const std::string&)> describe_;
  std::function<void()> ended_;  // the flight recorder's end, until called
};

// The ranges of device memory registered as this communicator's windows (register_window),
// shared with each registration, which takes its range out when it is undone.
class WindowRanges {
 public:
  void add(const void* begin, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.emplace_back(reinterpret_cast<uintptr_t>(begin), bytes);
  }
  void remove(const void* begin) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto at = reinterpret_cast<uintptr_t>(begin);
    ranges_.erase(std::remove_if(ranges_.begin(), ranges_.end(),
                                 [at](const auto& range) { return range.first == at; }),
                  ranges_.end());
  }
  // Whether [data, data + bytes) lies in one window.
  bool holds(const void* data, size_t bytes) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto at = reinterpret_cast<uintptr_t>(data);
    return std::any_of(ranges_.begin(), ranges_.end(), [&](const auto& range) {
      return at >= range.first && at + bytes <= range.first + range.second;
    });
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<uintptr_t, size_t>> ranges_;
};

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
// One ncclCommWindowRegister, deregistered when destroyed (unless the communicator was aborted:
// then NCCL has dropped it), the communicator kept until then.
class NcclWindow final : public Communicator::Window {
 public:
  NcclWindow(std::shared_ptr<NcclHandle> comm, ncclWindow_t window,
             std::shared_ptr<WindowRanges> ranges, const void* begin)
      : comm_(std::move(comm)), window_(window), ranges_(std::move(ranges)), begin_(begin) {}
  ~NcclWindow() override {
    ranges_->remove(begin_);
    if (comm_->aborted()) return;
    const ncclResult_t r = ncclCommWindowDeregister(comm_->get(), window_);
    if (r != ncclSuccess)
      spdlog::error("NCCL could not deregister a memory window: {}", ncclGetErrorString(r));
  }

 private:
  std::shared_ptr<NcclHandle> comm_;
  ncclWindow_t window_;
  std::shared_ptr<WindowRanges> ranges_;
  const void* begin_;
};

void* allocate_window_memory(size_t bytes) {
  void* data = nullptr;
  const ncclResult_t r = ncclMemAlloc(&data, bytes);
  if (r != ncclSuccess)
    throw Error(fmt::format("ncclMemAlloc of {:.1f} MiB (--nccl-symmetric) failed: {} ({})",
                            bytes / 1048576.0, ncclGetErrorString(r), ncclGetLastError(nullptr)));
  return data;
}
void release_window_memory(void* data) {
  const ncclResult_t r = ncclMemFree(data);
  if (r != ncclSuccess) spdlog::error("ncclMemFree failed: {}", ncclGetErrorString(r));
}
const DeviceAllocator kWindowMemory{"ncclMemAlloc", allocate_window_memory, release_window_memory};
#endif

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, std::shared_ptr<NcclHandle> comm,
                   std::shared_ptr<StoreClient> store, std::string group, double timeout_s)
      : Communicator(rank, size),
        comm_(std::move(comm)),
        store_(std::move(store)),
        group_(std::move(group)) {
    timeout_s_ = timeout_s;
  }
  // Waits for the communication stream, finalises the communicator, then (members, in
  // reverse) frees the scratch, the event and the stream; what fails is logged, not thrown.
  ~NcclCommunicator() override {
    // An aborted communicator's stream may never drain (a peer is gone): do not wait on it.
    if (!comm_->aborted()) {
      const cudaError_t error = cudaStreamSynchronize(comm_stream_.get());
      if (error != cudaSuccess)
        spdlog::error("nccl communicator {}: its stream did not drain at the end: {}", group_,
                      cudaGetErrorString(error));
    }
    comm_.reset();  // finalises, unless a Work still holds it
    for (cudaEvent_t event : graph_events_)
      cudaEventDestroy(event);
  }

  const char* backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  void set_compute_stream(void* stream) override {
    compute_stream_ = static_cast<cudaStream_t>(stream);
  }
  void* compute_stream() const override { return compute_stream_; }
  void* communication_stream() const { return comm_stream_.get(); }

  std::unique_ptr<Work> all_reduce_async(void* buffer, size_t count, DataType type,
                                         ReduceOp op) override {
    // In a window NCCL's symmetric kernels may run, which only sum: the average is then the
    // sum scaled by 1 / size (bitwise ncclAvg's pre-scaled sum for 2, 4, 8 ranks).
    const bool scaled = op == ReduceOp::kAverage &&
                        (type == DataType::kFloat32 || type == DataType::kBFloat16) &&
                        windows_->holds(buffer, count * dtype_bytes(type));
    return enqueue("all_reduce", count, type, [&] {
      const ncclResult_t r =
          ncclAllReduce(buffer, buffer, count, nccl_type(type), scaled ? ncclSum : nccl_op(op),
                        raw(), comm_stream_.get());
      if (r == ncclSuccess && scaled)
        launch_scale(buffer, type == DataType::kBFloat16, count, 1.0f / static_cast<float>(size_),
                     comm_stream_.get());
      return r;
    });
  }
  bool reduces_bf16() const override { return true; }
  std::unique_ptr<Work> all_reduce_bf16_async(float* buffer, void* scratch, size_t count,
                                              ReduceOp op) override {
    // All three on the communication stream, so that the conversions overlap the compute
    // stream's work as the reduction does.
    // A scratch in a window: summed, the average's scaling in the conversion back (as above).
    const bool scaled = op == ReduceOp::kAverage && windows_->holds(scratch, count * 2);
    return enqueue("all_reduce_bf16", count, DataType::kBFloat16, [&] {
      launch_float_to_bf16(buffer, scratch, count, comm_stream_.get());
      const ncclResult_t r =
          ncclAllReduce(scratch, scratch, count, ncclBfloat16, scaled ? ncclSum : nccl_op(op),
                        raw(), comm_stream_.get());
      if (r == ncclSuccess)
        launch_bf16_to_float(scratch, buffer, count, comm_stream_.get(),
                             scaled ? 1.0f / static_cast<float>(size_) : 1.0f);
      return r;
    });
  }
  std::unique_ptr<Work> reduce_scatter_bf16_async(const float* send, float* recv, void* scratch,
                                                  size_t count, ReduceOp op) override {
    return enqueue("reduce_scatter_bf16", count, DataType::kBFloat16, [&] {
      const size_t all = count * static_cast<size_t>(size_);
      uint16_t* block = static_cast<uint16_t*>(scratch) + count * static_cast<size_t>(rank_);
      launch_float_to_bf16(send, scratch, all, comm_stream_.get());
      const ncclResult_t r = ncclReduceScatter(scratch, block, count, ncclBfloat16, nccl_op(op),
                                               raw(), comm_stream_.get());
      if (r == ncclSuccess) launch_bf16_to_float(block, recv, count, comm_stream_.get());
      return r;
    });
  }
  std::unique_ptr<Work> broadcast_async(void* buffer, size_t count, DataType type,
                                        int root) override {
    return enqueue("broadcast", count, type, [&] {
      return ncclBroadcast(buffer, buffer, count, nccl_type(type), root, raw(), comm_stream_.get());
    });
  }
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                         DataType type) override {
    return enqueue("all_gather", count, type, [&] {
      return ncclAllGather(send, recv, count, nccl_type(type), raw(), comm_stream_.get());
    });
  }
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op) override {
    return enqueue("reduce_scatter", count, type, [&] {
      return ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), raw(),
                               comm_stream_.get());
    });
  }
  void send(const void* buffer, size_t count, DataType type, int peer) override {
    enqueue(
        "send", count, type,
        [&] { return ncclSend(buffer, count, nccl_type(type), peer, raw(), comm_stream_.get()); },
        {{true, const_cast<void*>(buffer), count, type, peer}})
        ->wait(timeout_s_);
  }
  void recv(void* buffer, size_t count, DataType type, int peer) override {
    enqueue(
        "recv", count, type,
        [&] { return ncclRecv(buffer, count, nccl_type(type), peer, raw(), comm_stream_.get()); },
        {{false, buffer, count, type, peer}})
        ->wait(timeout_s_);
  }
  void send_recv(const void* send_buffer, void* recv_buffer, size_t count, DataType type,
                 int send_peer, int recv_peer) override {
    // Grouped so that NCCL runs both at once.
    enqueue("send_recv", count, type, [&] {
      ncclGroupStart();
      ncclSend(send_buffer, count, nccl_type(type), send_peer, raw(), comm_stream_.get());
      ncclRecv(recv_buffer, count, nccl_type(type), recv_peer, raw(), comm_stream_.get());
      return ncclGroupEnd();
    })->wait(timeout_s_);
  }
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>& ops) override {
    DDP_CHECK(!ops.empty(), "batch_async: no operations to post");
    size_t count = 0;
    for (const P2pOp& op : ops) {
      DDP_CHECK(op.peer >= 0 && op.peer < size_ && op.peer != rank_,
                "batch_async: peer {} in a group of {} (this rank is {})", op.peer, size_, rank_);
      count += op.count;
    }
    return enqueue(
        "batch_p2p", count, DataType::kFloat32,
        [&] {
          ncclGroupStart();
          for (const P2pOp& op : ops) {
            if (op.send)
              ncclSend(op.buffer, op.count, nccl_type(op.type), op.peer, raw(), comm_stream_.get());
            else
              ncclRecv(op.buffer, op.count, nccl_type(op.type), op.peer, raw(), comm_stream_.get());
          }
          return ncclGroupEnd();
        },
        ops);
  }
  std::unique_ptr<Window> register_window(void* buffer, size_t bytes) override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    DDP_CHECK(!comm_->aborted(), "register_window on an aborted NCCL communicator (group {})",
              group_);
    ncclWindow_t window = nullptr;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    const ncclResult_t r = comm_->guarded(deadline, [&] {
      return ncclCommWindowRegister(raw(), buffer, bytes, &window, NCCL_WIN_COLL_SYMMETRIC);
    });
    if (r != ncclSuccess)
      throw Error(fmt::format("NCCL could not register {:.1f} MiB as a window of group {}: {} ({})",
                              bytes / 1048576.0, group_, ncclGetErrorString(r),
                              ncclGetLastError(raw())));
    DDP_USAGE_CHECK(window != nullptr,
                    "--nccl-symmetric: NCCL registered no window (its registration is off: "
                    "NCCL_WIN_ENABLE=0, or NCCL_LOCAL_REGISTER=0 where the ranks lack NVLink)");
    windows_->add(buffer, bytes);
    return std::make_unique<NcclWindow>(comm_, window, windows_, buffer);
#else
    return Communicator::register_window(buffer, bytes);
#endif
  }
  void barrier() override {
    enqueue("barrier", 1, DataType::kFloat32, [&] {
      return ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, raw(),
                           comm_stream_.get());
    })->wait(timeout_s_);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    const uint64_t seq = next_sequence();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;  // as this one: operations launch on the calling thread
    ncclComm_t child = nullptr;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    const ncclResult_t r =
        comm_->guarded(deadline, [&] { return ncclCommSplit(raw(), color, key, &child, &config); });
    DDP_CHECK(r == ncclSuccess && !comm_->aborted(), "{}",
              describe_stuck_operation(
                  store_.get(), group_, rank_, size_, seq, "split", 0, DataType::kInt32,
                  comm_->expired() ? fmt::format("no completion within the {:.1f}s deadline; "
                                                 "communicator aborted",
                                                 timeout_s_)
                                   : ncclGetErrorString(r)));
    std::shared_ptr<NcclHandle> handle =
        child != nullptr ? std::make_shared<NcclHandle>(child, nullptr)
                         : split_by_ids(color, key, deadline);  // seen with NCCL 2.28, one rank
    int child_rank = 0, child_size = 1;
    ncclCommUserRank(handle->get(), &child_rank);
    ncclCommCount(handle->get(), &child_size);
    auto made = std::make_unique<NcclCommunicator>(
        child_rank, child_size, std::move(handle), store_,
        fmt::format("{}/split{}c{}", group_, seq, color), timeout_s_);
    made->set_not_world();  // NCCL does not say which world ranks the members are
    return made;
  }
  void abort() override {
    comm_->abort();
  }
  std::string name() const override {
    return group_;
  }
  std::string describe_stuck(const std::string& what, uint64_t sequence,
                             const std::string& cause) override {
    return describe_stuck_step(store_.get(), group_, rank_, size_, what, sequence, cause);
  }

 private:
  // A split without ncclCommSplit: the ranks exchange (colour, key) and the new groups'
  // unique ids over this communicator, then each group initialises its own communicator.
  std::shared_ptr<NcclHandle> split_by_ids(int color, int key, Clock::time_point deadline) {
    int32_t* device = nullptr;
    const size_t words = 2 + sizeof(ncclUniqueId) / 4;  // colour, key, id of the group's root
    DDP_CUDA_CHECK(cudaMalloc(&device, words * 4 * (size_ + 1)));
    std::vector<int32_t> mine(words, 0), all(words * size_);
    mine[0] = color;
    mine[1] = key;
    // Pass 1: colours and keys, to find each group's root (smallest key, then rank).
    DDP_CUDA_CHECK(cudaMemcpy(device, mine.data(), words * 4, cudaMemcpyHostToDevice));
    all_gather(device, device + words, words, DataType::kInt32);
    DDP_CUDA_CHECK(cudaMemcpy(all.data(), device + words, all.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<std::pair<int, int>> members;  // (key, rank) of my colour
    for (int r = 0; r < size_; ++r)
      if (all[r * words] == color) members.emplace_back(all[r * words + 1], r);
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    if (new_rank == 0) {
      ncclUniqueId id;
      DDP_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
      std::memcpy(mine.data() + 2, id.internal, sizeof(id.internal));
    }
    // Pass 2: the roots' ids.
    DDP_CUDA_CHECK(cudaMemcpy(device, mine.data(), words * 4, cudaMemcpyHostToDevice));
    all_gather(device, device + words, words, DataType::kInt32);
    DDP_CUDA_CHECK(cudaMemcpy(all.data(), device + words, all.size() * 4, cudaMemcpyDeviceToHost));
    cudaFree(device);
    ncclUniqueId id;
    std::memcpy(id.internal, all.data() + members[0].second * words + 2, sizeof(id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const ncclResult_t first =
        ncclCommInitRankConfig(&child, static_cast<int>(members.size()), id, new_rank, &config);
    const ncclResult_t r = child != nullptr ? settle(child, first, deadline) : first;
    DDP_CHECK(r == ncclSuccess && child != nullptr,
              "split into colour {}: NCCL communicator init failed: {}", color,
              ncclGetErrorString(r));
    return make_blocking(child, new_rank, deadline);
  }

  template <typename Launch>
  // `ops`: a point-to-point call's operations (numbered apart, described by their peers).
  std::unique_ptr<Work> enqueue(const char* op, size_t count, DataType type, Launch launch,
                                std::vector<P2pOp> ops = {}) {
    const bool p2p = !ops.empty();
    const uint64_t seq = p2p ? next_p2p_sequence() : next_sequence();
    auto describe = [store = store_, group = group_, rank = rank_, size = size_, seq, op, count,
                     type, ops, flight = flight_](const std::string& cause) {
      if (!ops.empty()) return describe_stuck_p2p(group, seq, ops, cause);
      return describe_stuck_operation(store.get(), group, rank, size, seq, op, count, type, cause,
                                      {}, flight.get());
    };
    DDP_CHECK(!comm_->aborted(), "{} #{} on an aborted NCCL communicator (group {})", op, seq,
              group_);
    // The communication stream starts after everything queued so far on the compute stream.
    DDP_CUDA_CHECK(cudaEventRecord(ready_.get(), compute_stream_));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_.get(), ready_.get(), 0));
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    // Blocks on the host only to connect to a peer for the first time.
    const ncclResult_t r = comm_->guarded(deadline, launch);
    if (r != ncclSuccess || comm_->aborted()) {
      const std::string message = describe(
          comm_->expired()
              ? fmt::format("no completion within the {:.1f}s deadline (NCCL blocked on the "
                            "host); communicator aborted",
                            timeout_s_)
              : fmt::format("NCCL error {} ({})", ncclGetErrorString(r), ncclGetLastError(raw())));
      comm_->abort();
      throw Error(message);
    }
    // Inside a CUDA graph capture the event becomes part of the graph, which records it at
    // every replay: it is never handed to another operation, and lives as long as this
    // communicator.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DDP_CUDA_CHECK(cudaStreamIsCapturing(comm_stream_.get(), &capture));
    const bool captured = capture != cudaStreamCaptureStatusNone;
    cudaEvent_t done = nullptr;
    if (captured) {
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      graph_events_.push_back(done);
    } else {
      done = events_->take();
    }
    DDP_CUDA_CHECK(cudaEventRecord(done, comm_stream_.get()));
    if (p2p) return std::make_unique<NcclWork>(comm_, captured ? nullptr : events_, done, describe);
    flight_->started(seq, op, count, type);  // collectives only: point-to-point is numbered apart
    return std::make_unique<NcclWork>(comm_, captured ? nullptr : events_, done, describe,
                                      [flight = flight_, seq] { flight->ended(seq, true); });
  }

  ncclComm_t raw() const {
    return comm_->get();
  }

  std::shared_ptr<NcclHandle> comm_;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
  std::vector<cudaEvent_t> graph_events_;  // recorded by captured graphs: kept to the end
  std::shared_ptr<StoreClient> store_;
  std::string group_;
  cudaStream_t compute_stream_ = nullptr;
  CudaStream comm_stream_;                                      // NCCL's work
  CudaEvent ready_;                                             // the compute stream's mark
  DeviceBuffer<float> scratch_{1, MemoryCategory::kWorkspace};  // the barrier's float
  std::shared_ptr<WindowRanges> windows_ = std::make_shared<WindowRanges>();
};

}  // namespace

}  // namespace ddp

extern "C" const ddp::NcclBackend* ddp_nccl_backend() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  const ddp::DeviceAllocator* window_memory = &ddp::kWindowMemory;
#else
  const ddp::DeviceAllocator* window_memory = nullptr;
#endif
  static const ddp::NcclBackend backend{ddp::start_nccl_communicator, ddp::make_host_staged_nccl,
                                        ddp::nccl_library_version, window_memory};
  return &backend;
}

namespace ddp {

std::string nccl_library_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

CommunicatorStart start_nccl_communicator(int rank, int size, std::shared_ptr<StoreClient> store,
                                          const std::string& group, double timeout_s,
                                          Communicator* bootstrap) {
  ncclUniqueId id;
  const std::string key = fmt::format("ddp/nccl/{}/id", group);
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    DDP_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: {}", ncclGetErrorString(r));
  }
  if (size == 1) {
    // Nothing to share.
  } else if (store != nullptr) {
    if (rank == 0) store->set(key, std::string(id.internal, sizeof(id.internal)));
    const std::string value = store->wait_get(key, timeout_s);
    DDP_CHECK(value.size() == sizeof(id.internal), "malformed NCCL id in the store ({} bytes)",
              value.size());
    std::memcpy(id.internal, value.data(), sizeof(id.internal));
  } else {
    DDP_USAGE_CHECK(
        bootstrap != nullptr,
        "--backend nccl needs the rendezvous store (ddprun) or MPI (mpirun) to share its id");
    bootstrap->broadcast(id.internal, sizeof(id.internal) / 4, DataType::kInt32, 0);  // 128 bytes
  }
  // Non-blocking: NCCL starts on its own thread while this one goes on; the start is
  // abandoned (aborted) if the communicator is never asked for.
  struct Pending {
    ncclComm_t comm = nullptr;
    ~Pending() {
      if (comm != nullptr) ncclCommAbort(comm);
    }
  };
  auto pending = std::make_shared<Pending>();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  const ncclResult_t first = ncclCommInitRankConfig(&pending->comm, size, id, rank, &config);
  return [pending, first, deadline, rank, size, store, group,
          timeout_s]() -> std::unique_ptr<Communicator> {
    ncclComm_t comm = pending->comm;
    pending->comm = nullptr;  // from here on, owned below (or aborted on failure)
    const ncclResult_t r = comm != nullptr ? settle(comm, first, deadline) : first;
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      throw Error(fmt::format("NCCL communicator of {} ranks (rank {}) could not start: {}{}", size,
                              rank, r == ncclInProgress ? "timed out" : ncclGetErrorString(r),
                              r == ncclInProgress ? " (a rank never joined?)" : ""));
    }
    return std::make_unique<NcclCommunicator>(rank, size, make_blocking(comm, rank, deadline),
                                              store, group, timeout_s);
  };
}

}  // namespace ddp
