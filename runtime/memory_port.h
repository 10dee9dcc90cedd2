// Memory that code written once for the host and the device works in without knowing which:
// ZeRO's sharded buckets and state (dist/), the pipeline's hand-over buffers between a rank's
// stages (engine/runners), LibTorch's parameter store (torch/). The maker of a port decides
// where its memory is (the host's vectors, the GPU's buffers under a ledger category, LibTorch
// tensors) and in what order its copies run (at once, or on a stream).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace ddp {

struct MemoryPort {
  // `bytes` of this memory, alive while the result is held (contents undefined).
  std::function<std::shared_ptr<void>(size_t bytes)> allocate;
  // `bytes` from `src` to `dst` within this memory, in `stream`'s order.
  std::function<void(void* dst, const void* src, size_t bytes)> copy;
  // dst[bytes] = 0, in `stream`'s order.
  std::function<void(void* dst, size_t bytes)> clear;
  // The device's compute stream the copies are ordered on; null: the host's, done at once.
  void* stream = nullptr;
};

// The host's memory: vectors, memcpy and memset.
MemoryPort host_memory_port();

}  // namespace ddp
