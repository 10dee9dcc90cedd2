// REQUIRE_GPU(): skips a GPU test, saying why, where no GPU is usable (CI has none).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

namespace ddp {

inline bool gpu_usable(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *why = std::string("no usable GPU: ") + cudaGetErrorString(error);
    cudaGetLastError();
    return false;
  }
  if (count == 0) {
    *why = "no GPU visible";
    return false;
  }
  return true;
}

}  // namespace ddp

#define REQUIRE_GPU()                                    \
  do {                                                   \
    std::string why_;                                    \
    if (!::ddp::gpu_usable(&why_)) GTEST_SKIP() << why_; \
  } while (0)
