// Move-only owners of device memory and CUDA handles, and the per-category ledger of the
// bytes this process holds on its GPU (the memory report). Only for code built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "runtime/cuda_check.h"
#include "runtime/device_allocator.h"

namespace ddp {

// Synchronous host <-> device copies (what Reducer::set_device_copies takes).
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
  DDP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
  DDP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

enum class MemoryCategory {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kWorkspace,
  kData,
  kOther,
  kCount
};
const char* category_name(MemoryCategory category);

// Bytes held per category; updated by DeviceBuffer, read by the memory report.
struct MemoryLedger {
  std::array<std::atomic<size_t>, static_cast<size_t>(MemoryCategory::kCount)> bytes{};
  size_t total() const;
  // "parameters 2.6 MiB, gradients 2.6 MiB, ... = total 12.0 MiB"
  std::string describe() const;
};
MemoryLedger& memory_ledger();

// Device memory for `count` elements of T, allocated once (by cudaMalloc, or by `allocator`
// where one is given); freed on destruction (a failure to free is logged, never thrown).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t count, MemoryCategory category) : DeviceBuffer(count, category, nullptr) {}
  DeviceBuffer(size_t count, MemoryCategory category, const DeviceAllocator* allocator)
      : count_(count), category_(category), allocator_(allocator) {
    if (count == 0) return;
    if (allocator == nullptr)
      DDP_CUDA_CHECK(cudaMalloc(&data_, count * sizeof(T)));
    else
      data_ = static_cast<T*>(allocator->allocate(count * sizeof(T)));
    memory_ledger().bytes[static_cast<size_t>(category)] += bytes();
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      category_ = other.category_;
      allocator_ = std::exchange(other.allocator_, nullptr);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  // Where it came from (null: cudaMalloc).
  const DeviceAllocator* allocator() const { return allocator_; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    if (allocator_ != nullptr) {
      allocator_->release(data_);
    } else {
      const cudaError_t error = cudaFree(data_);
      if (error != cudaSuccess) spdlog::error("cudaFree failed: {}", cudaGetErrorString(error));
    }
    memory_ledger().bytes[static_cast<size_t>(category_)] -= bytes();
    data_ = nullptr;
  }
  T* data_ = nullptr;
  size_t count_ = 0;
  MemoryCategory category_ = MemoryCategory::kOther;
  const DeviceAllocator* allocator_ = nullptr;
};

// Pinned host memory (for asynchronous copies).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t count) : count_(count) {
    if (count) DDP_CUDA_CHECK(cudaMallocHost(&data_, count * sizeof(T)));
  }
  ~PinnedBuffer() {
    if (data_ != nullptr && cudaFreeHost(data_) != cudaSuccess)
      spdlog::error("cudaFreeHost failed");
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  T* data() const { return data_; }
  size_t count() const { return count_; }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

class CudaStream {
 public:
  CudaStream() { DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false) {
    DDP_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// "used X GiB, free Y GiB of Z GiB" from cudaMemGetInfo.
std::string driver_memory_line();

}  // namespace ddp
