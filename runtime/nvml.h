// NVML, the driver's management library, opened with dlopen so that a machine without the
// NVIDIA driver (or a CPU-only build) still runs: the one place that loads it, for GPU
// discovery in ddprun, ddpdoctor's checks and the training-time GPU monitor. Never a CUDA
// call; safe to use from a background thread.
#pragma once

#include <cstdint>
#include <string>

namespace ddp {

// One reading of a GPU. A field NVML cannot give (old driver, unsupported GPU) is negative.
struct GpuSample {
  double util_pct = -1;      // SM utilization over NVML's last sample period
  double mem_used_mib = -1;  // device memory in use, every process
  double mem_total_mib = -1;
  double power_w = -1;
  double power_limit_w = -1;  // enforced limit
  double temp_c = -1;
  double sm_clock_mhz = -1;
  uint64_t throttle = 0;  // nvmlClocksEventReasons bits (see throttle_names)
};

// Clock-event (throttle) reason bits as NVML defines them.
constexpr uint64_t kThrottlePowerCap = 0x4;     // SwPowerCap
constexpr uint64_t kThrottleHwSlowdown = 0x8;   // HwSlowdown
constexpr uint64_t kThrottleSwThermal = 0x20;   // SwThermalSlowdown
constexpr uint64_t kThrottleHwThermal = 0x40;   // HwThermalSlowdown
constexpr uint64_t kThrottlePowerBrake = 0x80;  // HwPowerBrakeSlowdown
constexpr uint64_t kThrottleThermal = kThrottleSwThermal | kThrottleHwThermal;
constexpr uint64_t kThrottlePower = kThrottlePowerCap | kThrottlePowerBrake;
// "power cap, sw thermal" for the bits that slow a busy GPU (idle and application-clock
// bits are left out), "" for none. Pure.
std::string throttle_names(uint64_t bits);

class Nvml {
 public:
  // Opens libnvidia-ml.so.1 and initialises NVML; available() says whether that worked and
  // why() why not.
  Nvml();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return available_; }
  const std::string& why() const { return why_; }
  bool library_found() const { return lib_ != nullptr; }

  std::string driver_version() const;
  int device_count() const;  // -1 when NVML is not available
  struct Device {
    std::string name;
    std::string uuid;  // "GPU-..."
    int cc_major = 0;
    int cc_minor = 0;
  };
  bool device(unsigned index, Device* out) const;
  // The NVML handle of the GPU with this UUID ("GPU-..."), or null.
  void* handle_by_uuid(const std::string& uuid) const;
  // Reads every field it can of `handle`.
  GpuSample sample(void* handle) const;

 private:
  template <typename Fn>
  Fn symbol(const char* name) const;

  void* lib_ = nullptr;
  bool available_ = false;
  void* utilization_ = nullptr;  // the sampled functions, resolved once
  void* memory_ = nullptr;
  void* power_ = nullptr;
  void* power_limit_ = nullptr;
  void* temperature_ = nullptr;
  void* clock_ = nullptr;
  void* reasons_ = nullptr;
  std::string why_;
};

}  // namespace ddp
