// bind_device() with CUDA. The driver API is reached through dlopen("libcuda.so.1") so that
// cuInit can be timed on its own and a context created by someone else can be detected
// before the runtime creates ours; nothing links libcuda.
#include <cuda.h>  // driver API types only
#include <dlfcn.h>

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/cuda_check.h"
#include "runtime/device.h"
#include "runtime/device_kernels.h"
#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {
namespace {

struct DriverApi {
  void* library = nullptr;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_state)(CUdevice, unsigned*, int*) = nullptr;
  CUresult (*ctx_current)(CUcontext*) = nullptr;
  CUresult (*error_name)(CUresult, const char**) = nullptr;

  std::string name_of(CUresult result) const {
    const char* name = nullptr;
    if (error_name != nullptr) error_name(result, &name);
    return name != nullptr ? name : fmt::format("CUresult {}", static_cast<int>(result));
  }
};

template <typename Fn>
void load_symbol(void* library, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(::dlsym(library, name));
  DDP_CHECK(*out != nullptr, "libcuda.so.1 has no symbol {} (driver too old?)", name);
}

DriverApi load_driver() {
  DriverApi api;
  api.library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  DDP_CHECK(api.library != nullptr,
            "cannot load libcuda.so.1 ({}): the NVIDIA driver is not installed or not visible in "
            "this container; use --device cpu on a machine without a GPU",
            ::dlerror());
  load_symbol(api.library, "cuInit", &api.init);
  load_symbol(api.library, "cuDeviceGetCount", &api.device_count);
  load_symbol(api.library, "cuDeviceGet", &api.device_get);
  load_symbol(api.library, "cuDevicePrimaryCtxGetState", &api.primary_ctx_state);
  load_symbol(api.library, "cuCtxGetCurrent", &api.ctx_current);
  load_symbol(api.library, "cuGetErrorName", &api.error_name);
  return api;
}

std::string format_uuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

DeviceInfo bind_once(const ProcessEnv& env) {
  DeviceInfo info;
  info.visible_devices = env.cuda_visible_devices_set ? env.cuda_visible_devices : "(unset)";
  Stopwatch clock;
  const DriverApi driver = load_driver();
  const CUresult init = driver.init(0);
  DDP_CHECK(
      init == CUDA_SUCCESS, "cuInit failed with {}; CUDA_VISIBLE_DEVICES={}: {}",
      driver.name_of(init), info.visible_devices,
      init == CUDA_ERROR_NO_DEVICE ? "no GPU is visible to this process"
      : init == CUDA_ERROR_INVALID_DEVICE
          ? "CUDA_VISIBLE_DEVICES names a device that does not exist (check the indices/UUIDs "
            "against nvidia-smi -L)"
          : "check the driver with nvidia-smi and ddpdoctor");
  info.phases.driver_ms = clock.milliseconds();

  int count = 0;
  DDP_CHECK(driver.device_count(&count) == CUDA_SUCCESS && count > 0,
            "no CUDA device visible (CUDA_VISIBLE_DEVICES={})", info.visible_devices);
  if (count == 1) {
    info.ordinal = 0;
    info.choice = "the only visible device";
  } else {
    info.ordinal = env.local_rank % count;
    info.choice = fmt::format("{} devices visible, took index {} = local rank {} mod {}", count,
                              info.ordinal, env.local_rank, count);
  }
  CUdevice device = 0;
  DDP_CHECK(driver.device_get(&device, info.ordinal) == CUDA_SUCCESS, "cuDeviceGet({}) failed",
            info.ordinal);
  unsigned flags = 0;
  int active = 0;
  CUcontext current = nullptr;
  driver.primary_ctx_state(device, &flags, &active);
  driver.ctx_current(&current);
  DDP_CHECK(!active && current == nullptr,
            "a CUDA context already exists in this process before bind_device(): some code "
            "touched CUDA first; bind_device() must be the first CUDA call");

  DDP_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  DDP_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  DDP_CHECK(info.driver_version / 1000 >= info.runtime_version / 1000,
            "driver/runtime mismatch: the driver supports CUDA {}.{} but this binary's runtime is "
            "CUDA {}.{}; update the driver or build with an older toolkit",
            info.driver_version / 1000, info.driver_version % 1000 / 10,
            info.runtime_version / 1000, info.runtime_version % 1000 / 10);

  clock.reset();
  DDP_CUDA_CHECK(cudaSetDevice(info.ordinal));
  DDP_CUDA_CHECK(cudaFree(nullptr));
  info.phases.context_ms = clock.milliseconds();

  clock.reset();
  int* probe = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(&probe, 1 << 20));
  info.phases.first_alloc_ms = clock.milliseconds();

  clock.reset();
  launch_touch_kernel(probe, nullptr);
  int answer = 0;
  DDP_CUDA_CHECK(cudaMemcpy(&answer, probe, sizeof(int), cudaMemcpyDeviceToHost));
  info.phases.first_kernel_ms = clock.milliseconds();
  DDP_CUDA_CHECK(cudaFree(probe));
  DDP_CHECK(answer == 42, "the first kernel wrote {} instead of 42", answer);

  cudaDeviceProp props{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&props, info.ordinal));
  info.name = props.name;
  info.uuid = format_uuid(props.uuid);
  info.cc_major = props.major;
  info.cc_minor = props.minor;
  info.total_bytes = props.totalGlobalMem;
  char bus[32] = {};
  cudaDeviceGetPCIBusId(bus, sizeof(bus), info.ordinal);
  info.pci_bus_id = bus;
  return info;
}

}  // namespace

bool cuda_built() {
  return true;
}

DeviceInfo bind_device(const ProcessEnv& env, const BindOptions& options) {
  double backoff = options.retry_backoff_s;
  for (int attempt = 1;; ++attempt) {
    try {
      DeviceInfo info = bind_once(env);
      info.phases.attempts = attempt;
      return info;
    } catch (const Error& e) {
      if (attempt > options.init_retries) throw;
      spdlog::warn("device start-up attempt {} of {} failed: {}; retrying in {:.1f}s", attempt,
                   options.init_retries + 1, e.what(), backoff);
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff *= 2;
    }
  }
}

}  // namespace ddp
