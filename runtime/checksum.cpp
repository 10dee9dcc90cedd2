// crc32_of over zlib.
#include "runtime/checksum.h"

#include <zlib.h>

#include <algorithm>

namespace ddp {

uint32_t crc32_of(const void* bytes, size_t count, uint32_t crc) {
  uLong value = crc;
  const auto* p = static_cast<const Bytef*>(bytes);
  while (count > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(count, 1u << 30));
    value = crc32(value, p, chunk);
    p += chunk;
    count -= chunk;
  }
  return static_cast<uint32_t>(value);
}

}  // namespace ddp
