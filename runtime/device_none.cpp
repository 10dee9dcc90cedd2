// Device binding without CUDA (a build without it, or a CPU-only program that links
// ddp_device_none): a clear error instead of a silent CPU fallback.
#include "runtime/device.h"
#include "runtime/error.h"

namespace ddp {

bool cuda_built() {
  return false;
}

DeviceInfo bind_device(const ProcessEnv&, const BindOptions&) {
  if (DDP_HAVE_CUDA)
    throw UsageError(
        "a GPU was asked for (--device cuda, or ddp::init's bind_gpu), but this program links ddp "
        "without CUDA; link it with find_package(ddp COMPONENTS cuda) (ddp::ddp) or ddp::device");
  throw UsageError(
      "a GPU was asked for (--device cuda, or ddp::init's bind_gpu), but this build has no CUDA "
      "support (CMake did not find the CUDA toolkit); rebuild with CUDA or use --device cpu");
}

}  // namespace ddp
