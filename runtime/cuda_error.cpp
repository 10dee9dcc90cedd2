// Maps CUDA errors to their causes and fixes (DESIGN.md, "Errors").
#include <cstdlib>
#include <string>

#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"
#include "runtime/error.h"

namespace ddp {
namespace {

std::string visible_devices() {
  const char* value = std::getenv("CUDA_VISIBLE_DEVICES");  // read-only echo for the message
  return value == nullptr ? "unset" : fmt::format("'{}'", value);
}

std::string cause_of(cudaError_t error) {
  switch (error) {
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage: {
      int device = 0, major = 0, minor = 0;
      cudaGetDevice(&device);
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
      return fmt::format(
          "this binary was built for CUDA architectures {} but the device is sm_{}{}; rebuild "
          "with -DCMAKE_CUDA_ARCHITECTURES={}{}",
          DDP_CUDA_ARCHITECTURES, major, minor, major, minor);
    }
    case cudaErrorInvalidDevice: {
      int count = 0;
      cudaGetDeviceCount(&count);
      return fmt::format("device index outside the {} visible device(s); CUDA_VISIBLE_DEVICES={}",
                         count, visible_devices());
    }
    case cudaErrorMemoryAllocation: {
      size_t free_bytes = 0, total_bytes = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return fmt::format("the driver reports {:.2f} GiB used and {:.2f} GiB free of {:.2f} GiB{}",
                         (total_bytes - free_bytes) / double(1u << 30),
                         free_bytes / double(1u << 30), total_bytes / double(1u << 30),
                         "; this process holds " + memory_ledger().describe());
    }
    case cudaErrorInsufficientDriver: {
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);
      cudaRuntimeGetVersion(&runtime);
      return fmt::format(
          "the driver supports CUDA {}.{} but this binary's runtime is CUDA {}.{}; "
          "update the driver or build with an older toolkit",
          driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    }
    case cudaErrorNoDevice:
      return fmt::format("no CUDA device is visible (CUDA_VISIBLE_DEVICES={})", visible_devices());
    default:
      return "";
  }
}
}  // namespace

namespace detail {
void throw_cuda_error(cudaError_t error, const char* statement, const char* file, int line) {
  const std::string cause = cause_of(error);
  const ProcessContext& c = process_context();
  throw Error(fmt::format("CUDA error {} ({}){}{} [at {}:{}: {}; rank {}/{}, device {}]",
                          cudaGetErrorName(error), cudaGetErrorString(error),
                          cause.empty() ? "" : ": ", cause, file, line, statement, c.rank, c.world,
                          c.device));
}
}  // namespace detail
}  // namespace ddp
