// The one number parser: the whole text must be exactly one number of the type, in range.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "runtime/parse.h"

namespace ddp {
namespace {

TEST(ParseNumber, WholeTextInRangeOrNothing) {
  EXPECT_EQ(parse_number<int>("128"), 128);
  EXPECT_EQ(parse_number<int>("-3"), -3);
  EXPECT_EQ(parse_number<int64_t>("9000000000"), int64_t{9000000000});
  EXPECT_EQ(parse_number<uint64_t>("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", " 1", "1 ", "+1", "12x", "0x10", "1.5", "--1", "abc"})
    EXPECT_FALSE(parse_number<int>(bad).has_value()) << "'" << bad << "'";
  EXPECT_FALSE(parse_number<int>("2147483648").has_value());  // out of range, not wrapped
  EXPECT_FALSE(parse_number<uint64_t>("-1").has_value());     // not 2^64 - 1
  EXPECT_FALSE(parse_number<uint64_t>("-0").has_value());
}

TEST(ParseNumber, FloatingPointWithExponents) {
  EXPECT_DOUBLE_EQ(*parse_number<double>("0.05"), 0.05);
  EXPECT_DOUBLE_EQ(*parse_number<double>("1e-3"), 1e-3);
  EXPECT_FLOAT_EQ(*parse_number<float>("-2.5"), -2.5f);
  EXPECT_DOUBLE_EQ(*parse_number<double>("300"), 300.0);
  for (const char* bad : {"", "1e", "0.05s", ".", " 2", "1,5"})
    EXPECT_FALSE(parse_number<double>(bad).has_value()) << "'" << bad << "'";
}

TEST(ParseNumber, PrefixSaysHowMuchItTook) {
  long value = 0;
  EXPECT_EQ(parse_number_prefix(std::string_view("4(x3)"), &value), 1u);
  EXPECT_EQ(value, 4);
  EXPECT_EQ(parse_number_prefix(std::string_view("16"), &value), 2u);
  EXPECT_EQ(value, 16);
  EXPECT_EQ(parse_number_prefix(std::string_view("(x3)"), &value), 0u);
  unsigned u = 0;
  EXPECT_EQ(parse_number_prefix(std::string_view("-1"), &u), 0u);
}

}  // namespace
}  // namespace ddp
