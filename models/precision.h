// The arithmetic of the GPU's matrix products (the CPU computes in fp32 only).
#pragma once

namespace ddp {

// fp32: exact float32 products; tf32: TF32 tensor cores, float32 in and out; bf16: bf16
// products and activations, float32 master weights and gradients.
enum class Precision { kFp32, kTf32, kBf16 };

inline const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

}  // namespace ddp
