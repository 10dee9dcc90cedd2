// Element-wise reductions of host buffers for the host backends (Gloo's reduce function,
// MPI's bf16 and fp16 operators, averaging), including bfloat16 and float16 stored as uint16.
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

// An IEEE half's value (exact: every half is a float). F. Giesen's branch-light conversion
// (public domain), as the hardware's F16C instructions convert.
inline float fp16_to_float(uint16_t bits) {
  const uint32_t shifted_exponent = 0x7c00u << 13;
  uint32_t wide = (bits & 0x7fffu) << 13;  // exponent and mantissa
  const uint32_t exponent = shifted_exponent & wide;
  wide += (127 - 15) << 23;            // the exponent's bias
  if (exponent == shifted_exponent) {  // Inf or NaN
    wide += (128 - 16) << 23;
  } else if (exponent == 0) {  // zero or subnormal: renormalised by a float subtraction
    wide += 1u << 23;
    float value, magic;
    const uint32_t magic_bits = 113u << 23;
    std::memcpy(&value, &wide, 4);
    std::memcpy(&magic, &magic_bits, 4);
    value -= magic;
    std::memcpy(&wide, &value, 4);
  }
  wide |= static_cast<uint32_t>(bits & 0x8000u) << 16;  // the sign
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

// A float rounded to the nearest IEEE half, ties to even (overflow: Inf; NaN stays NaN).
inline uint16_t float_to_fp16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint32_t out;
  if (bits >= (127u + 16) << 23) {  // 65536 or more: Inf, or NaN (quiet)
    out = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (bits < 113u << 23) {  // a half subnormal or zero: the float adder rounds
    const uint32_t magic_bits = ((127u - 15) + (23 - 10) + 1) << 23;
    float v, magic;
    std::memcpy(&v, &bits, 4);
    std::memcpy(&magic, &magic_bits, 4);
    v += magic;
    std::memcpy(&out, &v, 4);
    out -= magic_bits;
  } else {
    const uint32_t odd = (bits >> 13) & 1u;  // ties to even
    bits += ((15u - 127) << 23) + 0xfffu + odd;
    out = bits >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
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
