// Device binding in a build without CUDA: a clear error instead of a silent CPU fallback.
#include "runtime/device.h"
#include "runtime/error.h"

namespace ddp {

bool cuda_built() {
  return false;
}

DeviceInfo bind_device(const ProcessEnv&, const BindOptions&) {
  throw UsageError(
      "--device cuda: this build has no CUDA support (CMake did not find the CUDA toolkit, or "
      "DDP_WITH_CUDA=OFF); rebuild with CUDA or use --device cpu");
}

}  // namespace ddp
