// The NVML loader: symbols looked up by name, NVML's C structures declared here (their
// layout is NVML's stable ABI), so that nothing needs nvml.h at build time.
#include "runtime/nvml.h"

#include <dlfcn.h>

#include <vector>

namespace ddp {

namespace {
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlUtilization {
  unsigned gpu;
  unsigned memory;
};
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM
}  // namespace

std::string throttle_names(uint64_t bits) {
  const std::vector<std::pair<uint64_t, const char*>> names = {
      {kThrottlePowerCap, "power cap"},
      {kThrottleHwSlowdown, "hw slowdown"},
      {kThrottleSwThermal, "sw thermal"},
      {kThrottleHwThermal, "hw thermal"},
      {kThrottlePowerBrake, "power brake"}};
  std::string text;
  for (const auto& [bit, name] : names)
    if (bits & bit) text += (text.empty() ? "" : ", ") + std::string(name);
  return text;
}

template <typename Fn>
Fn Nvml::symbol(const char* name) const {
  return lib_ == nullptr ? nullptr : reinterpret_cast<Fn>(::dlsym(lib_, name));
}

Nvml::Nvml() {
  lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    why_ = "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine";
    return;
  }
  auto init = symbol<int (*)()>("nvmlInit_v2");
  if (init == nullptr || init() != 0) {
    why_ = "NVML did not initialise: the driver is installed but not working (check nvidia-smi)";
    return;
  }
  available_ = true;
  // Looked up once: the monitor samples ten times a second.
  utilization_ = ::dlsym(lib_, "nvmlDeviceGetUtilizationRates");
  memory_ = ::dlsym(lib_, "nvmlDeviceGetMemoryInfo");
  power_ = ::dlsym(lib_, "nvmlDeviceGetPowerUsage");
  power_limit_ = ::dlsym(lib_, "nvmlDeviceGetEnforcedPowerLimit");
  temperature_ = ::dlsym(lib_, "nvmlDeviceGetTemperature");
  clock_ = ::dlsym(lib_, "nvmlDeviceGetClockInfo");
  // Renamed in recent drivers; the old name stays as an alias.
  reasons_ = ::dlsym(lib_, "nvmlDeviceGetCurrentClocksEventReasons");
  if (reasons_ == nullptr) reasons_ = ::dlsym(lib_, "nvmlDeviceGetCurrentClocksThrottleReasons");
}

Nvml::~Nvml() {
  if (available_)
    if (auto shutdown = symbol<int (*)()>("nvmlShutdown")) shutdown();
  if (lib_ != nullptr) ::dlclose(lib_);
}

std::string Nvml::driver_version() const {
  char version[96] = {};
  if (auto get = symbol<int (*)(char*, unsigned)>("nvmlSystemGetDriverVersion"); available_ && get)
    get(version, sizeof(version));
  return version;
}

int Nvml::device_count() const {
  auto count = symbol<int (*)(unsigned*)>("nvmlDeviceGetCount_v2");
  unsigned n = 0;
  if (!available_ || count == nullptr || count(&n) != 0) return -1;
  return static_cast<int>(n);
}

bool Nvml::device(unsigned index, Device* out) const {
  auto handle = symbol<int (*)(unsigned, void**)>("nvmlDeviceGetHandleByIndex_v2");
  void* device = nullptr;
  if (!available_ || handle == nullptr || handle(index, &device) != 0) return false;
  char name[96] = {}, uuid[96] = {};
  if (auto get = symbol<int (*)(void*, char*, unsigned)>("nvmlDeviceGetName"))
    get(device, name, sizeof(name));
  if (auto get = symbol<int (*)(void*, char*, unsigned)>("nvmlDeviceGetUUID"))
    get(device, uuid, sizeof(uuid));
  if (auto get = symbol<int (*)(void*, int*, int*)>("nvmlDeviceGetCudaComputeCapability"))
    get(device, &out->cc_major, &out->cc_minor);
  out->name = name;
  out->uuid = uuid;
  return true;
}

void* Nvml::handle_by_uuid(const std::string& uuid) const {
  auto get = symbol<int (*)(const char*, void**)>("nvmlDeviceGetHandleByUUID");
  void* device = nullptr;
  if (!available_ || get == nullptr || get(uuid.c_str(), &device) != 0) return nullptr;
  return device;
}

GpuSample Nvml::sample(void* handle) const {
  GpuSample s;
  if (!available_ || handle == nullptr) return s;
  auto utilization = reinterpret_cast<int (*)(void*, NvmlUtilization*)>(utilization_);
  auto memory = reinterpret_cast<int (*)(void*, NvmlMemory*)>(memory_);
  auto power = reinterpret_cast<int (*)(void*, unsigned*)>(power_);
  auto limit = reinterpret_cast<int (*)(void*, unsigned*)>(power_limit_);
  auto temperature = reinterpret_cast<int (*)(void*, int, unsigned*)>(temperature_);
  auto clock = reinterpret_cast<int (*)(void*, int, unsigned*)>(clock_);
  auto reasons = reinterpret_cast<int (*)(void*, unsigned long long*)>(reasons_);
  NvmlUtilization u{};
  if (utilization && utilization(handle, &u) == 0) s.util_pct = u.gpu;
  NvmlMemory m{};
  if (memory && memory(handle, &m) == 0) {
    s.mem_used_mib = static_cast<double>(m.used) / (1 << 20);
    s.mem_total_mib = static_cast<double>(m.total) / (1 << 20);
  }
  unsigned value = 0;
  if (power && power(handle, &value) == 0) s.power_w = value / 1000.0;
  if (limit && limit(handle, &value) == 0) s.power_limit_w = value / 1000.0;
  if (temperature && temperature(handle, kTemperatureGpu, &value) == 0) s.temp_c = value;
  if (clock && clock(handle, kClockSm, &value) == 0) s.sm_clock_mhz = value;
  unsigned long long bits = 0;
  if (reasons && reasons(handle, &bits) == 0) s.throttle = bits;
  return s;
}

}  // namespace ddp
