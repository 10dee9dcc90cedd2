// DDP_CUDA_CHECK: every CUDA runtime call and kernel launch is checked; a failure throws
// ddp::Error carrying the statement, file:line, rank, device, and for the failures that
// have a known cause (no kernel image, invalid ordinal, out of memory, old driver) the
// cause and the fix. Only for code built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace ddp {
namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* statement, const char* file,
                                   int line);
}  // namespace detail

}  // namespace ddp

#define DDP_CUDA_CHECK(statement)                                                       \
  do {                                                                                  \
    const cudaError_t ddp_cuda_error_ = (statement);                                    \
    if (ddp_cuda_error_ != cudaSuccess)                                                 \
      ::ddp::detail::throw_cuda_error(ddp_cuda_error_, #statement, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch error (bad configuration, no kernel image).
#define DDP_CUDA_CHECK_LAUNCH() DDP_CUDA_CHECK(cudaGetLastError())
