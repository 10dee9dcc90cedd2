// Data parallelism for a GPU runner: the part of Reducer's set-up that is the same for the whole
// model and for a pipeline stage. Only built with CUDA.
#pragma once

#include <cstdint>
#include <string>

#include "dist/ddp.h"
#include "runtime/device_buffer.h"

namespace ddp {

// Makes the group's communicator wait for `stream` and gives Reducer the device copies; checks
// (collective) that every rank holds the same model; with `bf16_grads` (--grad-reduce bf16)
// returns the buffer the gradients cross in (`count` bf16 values; empty otherwise), which must
// live as long as `ddp` reduces.
inline DeviceBuffer<uint16_t> prepare_device_ddp(Reducer& ddp, cudaStream_t stream,
                                                 uint64_t fingerprint,
                                                 const std::string& description, bool bf16_grads,
                                                 size_t count,
                                                 const DeviceAllocator* wire_memory = nullptr) {
  ddp.comm().set_compute_stream(stream);
  ddp.set_device_copies(copy_to_device, copy_to_host);
  DeviceBuffer<int64_t> scratch(static_cast<size_t>(ddp.comm().size()) + 1, MemoryCategory::kOther);
  ddp.check_same_layout(fingerprint, description, scratch.data());
  DeviceBuffer<uint16_t> wire;
  if (bf16_grads) {
    wire = DeviceBuffer<uint16_t>(count, MemoryCategory::kGradients, wire_memory);
    ddp.reduce_in_bf16(wire.data());
  }
  return wire;
}

}  // namespace ddp
