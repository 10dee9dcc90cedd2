// ddp::Autocast over LibTorch's autocast API of either generation.
#include "torch/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "runtime/error.h"

namespace ddp {

namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool enabled(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(device);
}
c10::ScalarType dtype_of(c10::DeviceType device) {
  return at::autocast::get_autocast_dtype(device);
}
void set(c10::DeviceType device, bool on, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, on);
}
#else
bool enabled(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
}
c10::ScalarType dtype_of(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
}
void set(c10::DeviceType device, bool on, c10::ScalarType dtype) {
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(on);
  }
}
#endif

}  // namespace

Autocast::Autocast(c10::DeviceType device, c10::ScalarType dtype)
    : device_(device), was_enabled_(false), was_dtype_(dtype) {
  DDP_USAGE_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
                  "ddp::Autocast: device {} where torch::kCPU or torch::kCUDA was expected",
                  c10::DeviceTypeName(device));
  was_enabled_ = enabled(device);
  was_dtype_ = dtype_of(device);
  set(device, true, dtype);
}

AutocastState AutocastState::now() {
  AutocastState state;
  state.cpu = enabled(c10::DeviceType::CPU);
  state.cuda = enabled(c10::DeviceType::CUDA);
  state.cpu_dtype = dtype_of(c10::DeviceType::CPU);
  state.cuda_dtype = dtype_of(c10::DeviceType::CUDA);
  return state;
}

void AutocastState::apply() const {
  set(c10::DeviceType::CPU, cpu, cpu_dtype);
  set(c10::DeviceType::CUDA, cuda, cuda_dtype);
}

Autocast::~Autocast() {
  set(device_, was_enabled_, was_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

}  // namespace ddp
