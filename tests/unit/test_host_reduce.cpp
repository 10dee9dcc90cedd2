// The host backends' half-precision arithmetic: float16 conversions against IEEE's values and
// as exact inverses, and the float16 sum rounded once from float.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "collectives/host_reduce.h"

namespace ddp {
namespace {

TEST(Float16, KnownValuesConvertAsIeeeSays) {
  EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(1.0f / 3), 0x3555);               // 0.33325195...
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);               // the largest half
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);               // rounds up past it: Inf
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);               // rounds down to it
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -26)), 0x0000);  // below half of it: zero
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_FLOAT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(fp16_to_float(0xfc00)) && fp16_to_float(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7e01)));
}

TEST(Float16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const bool nan = (half & 0x7c00) == 0x7c00 && (half & 0x03ff) != 0;
    if (nan) continue;
    ASSERT_EQ(float_to_fp16(fp16_to_float(half)), half) << std::hex << bits;
  }
}

TEST(Float16, SumsAreRoundedOnceAndAveragesDivideInFloat) {
  const uint16_t a[] = {float_to_fp16(1.0f), float_to_fp16(2048.0f), float_to_fp16(0.1f)};
  const uint16_t b[] = {float_to_fp16(2.0f), float_to_fp16(1.0f), float_to_fp16(0.2f)};
  uint16_t out[3];
  reduce_into(out, a, b, 3, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(fp16_to_float(out[0]), 3.0f);
  EXPECT_EQ(fp16_to_float(out[1]), 2048.0f);  // 2049 is not a half: ties to even
  EXPECT_EQ(out[2], float_to_fp16(fp16_to_float(a[2]) + fp16_to_float(b[2])));
  scale_by(out, 3, DataType::kFloat16, 2);
  EXPECT_EQ(fp16_to_float(out[0]), 1.5f);
  EXPECT_EQ(dtype_bytes(DataType::kFloat16), 2u);
  EXPECT_STREQ(dtype_name(DataType::kFloat16), "float16");
}

}  // namespace
}  // namespace ddp
