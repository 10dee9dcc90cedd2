// Finds this machine's GPUs without initialising CUDA: the parent's CUDA_VISIBLE_DEVICES
// (indices or UUIDs, kept as given), else NVML loaded with dlopen (no CUDA context), else the
// entries of /proc/driver/nvidia/gpus. ddprun never loads libcuda.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct GpuList {
  std::string source;  // "CUDA_VISIBLE_DEVICES", "NVML", "/proc/driver/nvidia/gpus", "none"
  std::vector<std::string> ids;  // what each worker's CUDA_VISIBLE_DEVICES will hold
  std::string detail;            // what was tried, for error messages
};

// Splits "4,6" or "GPU-ab..,GPU-cd.." on commas, trimming spaces; "" gives no devices.
std::vector<std::string> split_visible_devices(const std::string& value);

// `cuda_visible_devices`: the parent's value, or nullopt when unset.
GpuList discover_gpus(const std::optional<std::string>& cuda_visible_devices);

}  // namespace ddp
