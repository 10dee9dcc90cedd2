// The memory ledger and the driver's view of memory.
#include "runtime/device_buffer.h"

#include <fmt/format.h>

namespace ddp {

const char* category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizerState:
      return "optimizer state";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kWorkspace:
      return "workspace";
    case MemoryCategory::kData:
      return "data";
    default:
      return "other";
  }
}

MemoryLedger& memory_ledger() {
  static MemoryLedger ledger;  // plain counters: owns no GPU state
  return ledger;
}

size_t MemoryLedger::total() const {
  size_t sum = 0;
  for (const auto& b : bytes)
    sum += b.load();
  return sum;
}

std::string MemoryLedger::describe() const {
  std::string text;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const size_t b = bytes[i].load();
    if (b == 0) continue;
    text += fmt::format("{}{} {:.1f} MiB", text.empty() ? "" : ", ",
                        category_name(static_cast<MemoryCategory>(i)), b / 1048576.0);
  }
  return fmt::format("{} = {:.1f} MiB", text.empty() ? "nothing" : text, total() / 1048576.0);
}

std::string driver_memory_line() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return "driver memory unknown";
  return fmt::format("driver: {:.2f} GiB used, {:.2f} GiB free of {:.2f} GiB",
                     (total_bytes - free_bytes) / double(1u << 30), free_bytes / double(1u << 30),
                     total_bytes / double(1u << 30));
}

}  // namespace ddp
