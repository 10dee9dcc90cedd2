// GPU discovery without CUDA: NVML's C API is looked up by name through dlopen so that
// ddprun links no NVIDIA library at all.
#include "launcher/gpu_discovery.h"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>

#include <fmt/format.h>

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
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *detail += "NVML: libnvidia-ml.so.1 not found; ";
    return -1;
  }
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "nvmlInit_v2"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<InitFn>(::dlsym(lib, "nvmlShutdown"));
  int result = -1;
  if (init != nullptr && count != nullptr && init() == 0) {
    unsigned n = 0;
    if (count(&n) == 0) result = static_cast<int>(n);
    if (shutdown != nullptr) shutdown();
  }
  if (result < 0) *detail += "NVML: initialisation failed; ";
  ::dlclose(lib);
  return result;
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
