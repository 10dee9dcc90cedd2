// GPU discovery without CUDA: NVML (runtime/nvml.h, opened with dlopen) or the driver's /proc
// entries, so that ddprun links no NVIDIA library at all.
#include "launcher/gpu_discovery.h"

#include <dirent.h>

#include <algorithm>

#include <fmt/format.h>

#include "runtime/nvml.h"

namespace ddp {

std::vector<std::string> split_visible_devices(const std::string& value) {
  std::vector<std::string> ids;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    std::string id = value.substr(start, end - start);
    id.erase(0, id.find_first_not_of(" \t"));
    id.erase(id.find_last_not_of(" \t") + 1);
    if (!id.empty()) ids.push_back(id);
    start = end + 1;
  }
  return ids;
}

namespace {

// Counts GPUs through NVML; -1 when NVML is not there or fails.
int nvml_device_count(std::string* detail) {
  const Nvml nvml;
  const int count = nvml.device_count();
  if (!nvml.library_found())
    *detail += "NVML: libnvidia-ml.so.1 not found; ";
  else if (count < 0)
    *detail += "NVML: initialisation failed; ";
  return count;
}

int proc_gpu_count(std::string* detail) {
  DIR* dir = ::opendir("/proc/driver/nvidia/gpus");
  if (dir == nullptr) {
    *detail += "/proc/driver/nvidia/gpus: absent";
    return -1;
  }
  int n = 0;
  while (dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  ::closedir(dir);
  return n;
}

}  // namespace

GpuList discover_gpus(const std::optional<std::string>& cuda_visible_devices) {
  GpuList list;
  if (cuda_visible_devices) {
    list.source = "CUDA_VISIBLE_DEVICES";
    list.ids = split_visible_devices(*cuda_visible_devices);
    list.detail = fmt::format("CUDA_VISIBLE_DEVICES='{}'", *cuda_visible_devices);
    return list;
  }
  int count = nvml_device_count(&list.detail);
  list.source = "NVML";
  if (count < 0) {
    count = proc_gpu_count(&list.detail);
    list.source = "/proc/driver/nvidia/gpus";
  }
  if (count <= 0) {
    list.source = "none";
    return list;
  }
  for (int i = 0; i < count; ++i)
    list.ids.push_back(std::to_string(i));
  list.detail = fmt::format("{} GPUs from {}", count, list.source);
  return list;
}

}  // namespace ddp
