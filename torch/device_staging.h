// How the ranks' comparisons (dist/agreement.h) reach a device communicator from a
// LibTorch program: LibTorch's copies and a scratch tensor on the device. Internal: not installed.
#pragma once

#include <torch/torch.h>

#include "dist/agreement.h"

namespace ddp {

// Copies through LibTorch and a scratch of `scratch` (grown on `device` as asked; the caller
// drops it when the comparison is over). `scratch` must outlive the returned staging's use.
inline DeviceStaging torch_staging(torch::Device device, torch::Tensor& scratch) {
  DeviceStaging through;
  through.to_device = [](void* dst, const void* src, size_t bytes) {
    auto host =
        torch::from_blob(const_cast<void*>(src), {static_cast<int64_t>(bytes)}, torch::kUInt8);
    torch::from_blob(dst, {static_cast<int64_t>(bytes)},
                     torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA))
        .copy_(host);
  };
  through.to_host = [](void* dst, const void* src, size_t bytes) {
    auto on_device =
        torch::from_blob(const_cast<void*>(src), {static_cast<int64_t>(bytes)},
                         torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA));
    torch::from_blob(dst, {static_cast<int64_t>(bytes)}, torch::kUInt8).copy_(on_device);
  };
  through.scratch = [device, &scratch](size_t bytes) {
    if (!scratch.defined() || scratch.numel() < static_cast<int64_t>(bytes))
      scratch = torch::empty({static_cast<int64_t>(bytes)},
                             torch::TensorOptions().dtype(torch::kUInt8).device(device));
    return scratch.data_ptr();
  };
  return through;
}

}  // namespace ddp
