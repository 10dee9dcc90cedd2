// host_memory_port: the host's vectors and copies.
#include "runtime/memory_port.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace ddp {

MemoryPort host_memory_port() {
  MemoryPort port;
  port.allocate = [](size_t bytes) -> std::shared_ptr<void> {
    // In 8-byte words, so that any element type is aligned.
    const auto words = std::make_shared<std::vector<uint64_t>>((bytes + 7) / 8, 0);
    return std::shared_ptr<void>(words, words->data());
  };
  port.copy = [](void* dst, const void* src, size_t bytes) {
    if (bytes > 0) std::memmove(dst, src, bytes);
  };
  port.clear = [](void* dst, size_t bytes) {
    if (bytes > 0) std::memset(dst, 0, bytes);
  };
  return port;
}

}  // namespace ddp
