// Element-wise reductions of host buffers for the host backends (Gloo's reduce function,
// MPI's bf16 operator, averaging), including bfloat16 stored as uint16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "collectives/communicator.h"

namespace ddp {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

inline uint16_t float_to_bf16(float value) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// out[i] = op(a[i], b[i]) for sum and max (average is a sum followed by scale_by()).
void reduce_into(void* out, const void* a, const void* b, size_t count, DataType type, ReduceOp op);
// out[i] = blocks[0][i] op blocks[1][i] op ... op blocks[n-1][i], combined left to right in
// block (rank) order, then divided by n for kAverage. `blocks` holds n blocks of `count`
// elements back to back. The order fixes every element's rounding whatever the length of the
// buffer it travelled in, so a reduce-scatter of any bucket layout and an all-reduce of any
// other give bitwise the same sums (a ring's order depends on where an element falls).
void reduce_blocks_in_order(void* out, const void* blocks, int n, size_t count, DataType type,
                            ReduceOp op);
// buffer[i] /= divisor (floating types only).
void scale_by(void* buffer, size_t count, DataType type, double divisor);

}  // namespace ddp
