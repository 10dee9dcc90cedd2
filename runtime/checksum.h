// CRC-32 (zlib's): checkpoints' integrity and the replicas' weight comparison.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp {

// CRC-32 of bytes[0, count), continuing from `crc` (0 to start). Any count (zlib takes at
// most 4 GiB a call; longer buffers go in pieces).
uint32_t crc32_of(const void* bytes, size_t count, uint32_t crc = 0);

// A checksum of a float buffer (host), for checking that replicas hold identical weights.
inline uint32_t params_checksum(const float* params, size_t count) {
  return crc32_of(params, count * sizeof(float));
}

}  // namespace ddp
