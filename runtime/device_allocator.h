// Device memory from an allocator other than cudaMalloc: NCCL's ncclMemAlloc, whose memory a
// communicator can register as a window (Communicator::register_window). No CUDA header, so
// that the collectives' interface can name it.
#pragma once

#include <cstddef>

namespace ddp {

// An allocator of device memory: its name, and its allocate and release functions.
struct DeviceAllocator {
  const char* name = "";                      // "ncclMemAlloc", for messages
  void* (*allocate)(size_t bytes) = nullptr;  // throws ddp::Error when it cannot
  void (*release)(void* data) = nullptr;      // logs a failure, never throws
};

}  // namespace ddp
