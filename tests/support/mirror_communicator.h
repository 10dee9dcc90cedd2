// A host communicator for one-process tests of code that reduces over ranks: rank 0 of `size`
// ranks that all hold what this one holds, so that a sum is `size` times this rank's buffer, an
// average or a maximum is the buffer itself, a broadcast changes nothing and an all-gather
// repeats the buffer. Each call is done when it returns. Point-to-point and splits throw.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/error.h"

namespace ddp {

class MirrorCommunicator final : public Communicator {
 public:
  explicit MirrorCommunicator(int size) : Communicator(0, size) {}
  const char* backend() const override { return "mirror"; }
  bool device_buffers() const override { return false; }
  std::unique_ptr<Work> all_reduce_async(void* buffer, size_t count, DataType type,
                                         ReduceOp op) override {
    if (op == ReduceOp::kSum) scale(buffer, count, type);
    return done();
  }
  std::unique_ptr<Work> broadcast_async(void*, size_t, DataType, int) override { return done(); }
  std::unique_ptr<Work> all_gather_async(const void* in, void* out, size_t count,
                                         DataType type) override {
    const size_t bytes = count * dtype_bytes(type);
    for (int r = 0; r < size(); ++r)
      std::memmove(static_cast<char*>(out) + r * bytes, in, bytes);
    return done();
  }
  std::unique_ptr<Work> reduce_scatter_async(const void*, void*, size_t, DataType,
                                             ReduceOp) override {
    throw Error("MirrorCommunicator: no reduce-scatter");
  }
  void send(const void*, size_t, DataType, int) override { throw Error("MirrorCommunicator"); }
  void recv(void*, size_t, DataType, int) override { throw Error("MirrorCommunicator"); }
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>&) override {
    throw Error("MirrorCommunicator: no point-to-point");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    throw Error("MirrorCommunicator: no split");
  }

 private:
  class Done final : public Work {
   public:
    void wait(double) override {}
    void then_on(void*) override {}
    bool is_completed() override { return true; }
  };
  static std::unique_ptr<Work> done() { return std::make_unique<Done>(); }
  void scale(void* buffer, size_t count, DataType type) const {
    const int n = size();
    switch (type) {
      case DataType::kFloat32:
        for (size_t i = 0; i < count; ++i)
          static_cast<float*>(buffer)[i] *= n;
        return;
      case DataType::kFloat64:
        for (size_t i = 0; i < count; ++i)
          static_cast<double*>(buffer)[i] *= n;
        return;
      case DataType::kInt32:
        for (size_t i = 0; i < count; ++i)
          static_cast<int32_t*>(buffer)[i] *= n;
        return;
      case DataType::kInt64:
        for (size_t i = 0; i < count; ++i)
          static_cast<int64_t*>(buffer)[i] *= n;
        return;
      default:
        throw Error("MirrorCommunicator: sums float32, float64, int32 and int64 only");
    }
  }
};

}  // namespace ddp
