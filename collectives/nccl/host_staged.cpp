// HostStaged: a device communicator's calls made with host buffers, each staged through one
// device buffer (grown as needed) and waited for, for the engine's bookkeeping (window sums,
// gathers of figures, a pipeline stage's weights sent to rank 0) where speed does not matter.
#include <cuda_runtime.h>

#include <algorithm>

#include "collectives/communicator.h"
#include "collectives/nccl/nccl_communicator.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"
#include "runtime/error.h"

namespace ddp {

namespace {

class DoneWork final : public Work {
 public:
  void wait(double) override {}
  void then_on(void*) override {}
  bool is_completed() override { return true; }
};

class HostStaged final : public Communicator {
 public:
  explicit HostStaged(Communicator& device)
      : Communicator(device.rank(), device.size()), inner_(device) {
    timeout_s_ = device.timeout();
  }
  const char* backend() const override { return inner_.backend(); }
  bool device_buffers() const override { return false; }

  std::unique_ptr<Work> all_reduce_async(void* buffer, size_t count, DataType type,
                                         ReduceOp op) override {
    const size_t bytes = count * dtype_bytes(type);
    void* staged = stage(bytes, 0);
    to_device(staged, buffer, bytes);
    inner_.all_reduce(staged, count, type, op);
    to_host(buffer, staged, bytes);
    return std::make_unique<DoneWork>();
  }
  // Host bookkeeping through device memory: each call completes before it returns (the
  // host buffer is read back), so its Work is already done.
  std::unique_ptr<Work> broadcast_async(void* buffer, size_t count, DataType type,
                                        int root) override {
    const size_t bytes = count * dtype_bytes(type);
    void* staged = stage(bytes, 0);
    to_device(staged, buffer, bytes);
    inner_.broadcast(staged, count, type, root);
    to_host(buffer, staged, bytes);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                         DataType type) override {
    const size_t bytes = count * dtype_bytes(type);
    char* staged = static_cast<char*>(stage(bytes * (size() + 1), 0));
    to_device(staged, send, bytes);
    inner_.all_gather(staged, staged + bytes, count, type);
    to_host(recv, staged + bytes, bytes * size());
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op) override {
    const size_t bytes = count * dtype_bytes(type);
    char* staged = static_cast<char*>(stage(bytes * (size() + 1), 0));
    to_device(staged, send, bytes * size());
    inner_.reduce_scatter(staged, staged + bytes * size(), count, type, op);
    to_host(recv, staged + bytes * size(), bytes);
    return std::make_unique<DoneWork>();
  }
  void send(const void* buffer, size_t count, DataType type, int peer) override {
    const size_t bytes = count * dtype_bytes(type);
    void* staged = stage(bytes, 0);
    to_device(staged, buffer, bytes);
    inner_.send(staged, count, type, peer);
  }
  void recv(void* buffer, size_t count, DataType type, int peer) override {
    const size_t bytes = count * dtype_bytes(type);
    void* staged = stage(bytes, 0);
    inner_.recv(staged, count, type, peer);
    to_host(buffer, staged, bytes);
  }
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>& ops) override {
    size_t total = 0;
    for (const P2pOp& op : ops)
      total += (op.count * dtype_bytes(op.type) + 255) / 256 * 256;
    char* staged = static_cast<char*>(stage(total, 0));
    std::vector<P2pOp> device_ops = ops;
    size_t at = 0;
    for (P2pOp& op : device_ops) {
      const size_t bytes = op.count * dtype_bytes(op.type);
      if (op.send) to_device(staged + at, op.buffer, bytes);
      op.buffer = staged + at;
      at += (bytes + 255) / 256 * 256;
    }
    inner_.batch_async(device_ops)->wait(timeout());
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].send)
        to_host(ops[i].buffer, device_ops[i].buffer, ops[i].count * dtype_bytes(ops[i].type));
    return std::make_unique<DoneWork>();
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Communicator> split(int, int) override {
    DDP_CHECK(false, "split() of a host-staged view: split the device communicator instead");
    return nullptr;
  }
  void abort() override { inner_.abort(); }
  std::string describe_stuck(const std::string& what, uint64_t sequence,
                             const std::string& cause) override {
    return inner_.describe_stuck(what, sequence, cause);
  }

 private:
  void* stage(size_t bytes, int) {
    if (buffer_.bytes() < bytes)
      buffer_ = DeviceBuffer<char>(std::max<size_t>(bytes, 4096), MemoryCategory::kOther);
    return buffer_.data();
  }
  static void to_device(void* dst, const void* src, size_t bytes) {
    DDP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  static void to_host(void* dst, const void* src, size_t bytes) {
    DDP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }

  Communicator& inner_;
  DeviceBuffer<char> buffer_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_nccl(Communicator& device) {
  return std::make_unique<HostStaged>(device);
}

}  // namespace ddp
