// ddp::Autocast: LibTorch's autocast (Python's `with torch.autocast(device, dtype)`) as a scope
// guard, the same on LibTorch 1.13 and 2.x (whose calls differ: set_enabled / set_cpu_enabled
// before 2.4, set_autocast_enabled(device type) after):
//
//   {
//     ddp::Autocast autocast(torch::kCUDA, torch::kBFloat16);
//     logits = model.forward(x);            // bf16 products, float32 weights and gradients
//   }
//   auto loss = torch::nll_loss(logits.to(torch::kFloat32), y);
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace ddp {

// Autocast on `device`'s type to `dtype` while it lives; the previous state given back at its
// end, and the casts' cache cleared when autocast ends there (as Python's context does).
class Autocast {
 public:
  // Turns autocast on for `device` (torch::kCPU or torch::kCUDA) with `dtype`.
  explicit Autocast(c10::DeviceType device, c10::ScalarType dtype = c10::kBFloat16);
  // The previous state back.
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

// Autocast's state on the CPU and CUDA (whether on, and to which dtype), taken and put back as
// a whole: ddp::checkpoint's recompute runs under the state its forward ran under.
struct AutocastState {
  bool cpu = false;                            // autocast on for the CPU
  bool cuda = false;                           // autocast on for CUDA
  c10::ScalarType cpu_dtype = c10::kBFloat16;  // the CPU's lower precision
  c10::ScalarType cuda_dtype = c10::kHalf;     // CUDA's lower precision
  // The state now.
  static AutocastState now();
  // Makes it the state now.
  void apply() const;
};

}  // namespace ddp
