// The host backends' half-precision arithmetic: float16 conversions against IEEE's values and
// as exact inverses, and the float16 sum rounded once from float.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "collectives/communicator.h"
#include "collectives/host_reduce.h"
#include "runtime/error.h"

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

// A device communicator that only keeps its compute stream (the collectives are not called).
class StreamOnly final : public Communicator {
 public:
  StreamOnly(bool device) : Communicator(0, 1), device_(device) {}
  const char* backend() const override { return "stream-only"; }
  bool device_buffers() const override { return device_; }
  void set_compute_stream(void* stream) override { stream_ = stream; }
  void* compute_stream() const override { return stream_; }
  std::unique_ptr<Work> all_reduce_async(void*, size_t, DataType, ReduceOp) override {
    return none();
  }
  std::unique_ptr<Work> broadcast_async(void*, size_t, DataType, int) override { return none(); }
  std::unique_ptr<Work> all_gather_async(const void*, void*, size_t, DataType) override {
    return none();
  }
  std::unique_ptr<Work> reduce_scatter_async(const void*, void*, size_t, DataType,
                                             ReduceOp) override {
    return none();
  }
  void send(const void*, size_t, DataType, int) override { none(); }
  void recv(void*, size_t, DataType, int) override { none(); }
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>&) override { return none(); }
  void barrier() override { none(); }
  std::unique_ptr<Communicator> split(int, int) override {
    none();
    return nullptr;
  }

 private:
  static std::unique_ptr<Work> none() { throw Error("StreamOnly: no collectives"); }
  bool device_;
  void* stream_ = nullptr;
};

// ComputeStreamGuard: a library's stream for the guard's life, the user's back at its end
// (nested guards too); nothing on a host communicator.
TEST(ComputeStreamGuard, GivesTheUsersStreamBack) {
  int user = 0, library = 0, inner = 0;
  StreamOnly device(true);
  device.set_compute_stream(&user);
  {
    const ComputeStreamGuard outer(device, &library);
    EXPECT_EQ(device.compute_stream(), &library);
    {
      const ComputeStreamGuard nested(device, &inner);
      EXPECT_EQ(device.compute_stream(), &inner);
    }
    EXPECT_EQ(device.compute_stream(), &library);
  }
  EXPECT_EQ(device.compute_stream(), &user);
  StreamOnly host(false);
  {
    const ComputeStreamGuard guard(host, &library);
    EXPECT_EQ(host.compute_stream(), nullptr);
  }
}

// The flight recorder keeps the last kFlightEntries calls, oldest first, each ended by its
// sequence number; what came before a stuck call is named newest first, with how it ended.
TEST(FlightRecorder, KeepsTheLastCallsAndNamesThoseBeforeAStuckOne) {
  FlightRecorder flight;
  for (uint64_t seq = 1; seq <= kFlightEntries + 6; ++seq) {
    flight.started(seq, seq % 2 ? "all_reduce" : "broadcast", seq, DataType::kFloat32);
    if (seq < kFlightEntries + 4) flight.ended(seq, true);
  }
  flight.ended(kFlightEntries + 5, false);
  const std::vector<FlightEntry> kept = flight.entries();
  ASSERT_EQ(kept.size(), kFlightEntries);
  EXPECT_EQ(kept.front().sequence, 7u);
  EXPECT_EQ(kept.back().sequence, kFlightEntries + 6);
  EXPECT_TRUE(kept.back().started >= kept.front().started);
  EXPECT_FALSE(kept.back().done || kept.back().failed) << "the last one is pending";
  EXPECT_TRUE(kept[kept.size() - 2].failed);
  const std::string before = flight.recent_before(kFlightEntries + 6);
  // Before #70: #69 failed, #68 issued and never seen to end, #67 done.
  EXPECT_EQ(before.find("all_reduce #69 (69 x float32) failed, broadcast #68 (68 x float32) "
                        "issued "),
            0u)
      << before;
  EXPECT_NE(before.find("s before it, not seen to end, all_reduce #67 (67 x float32) done "),
            std::string::npos)
      << before;
  EXPECT_EQ(flight.recent_before(7), "") << "nothing kept before the oldest";
  flight.ended(1, true);  // gone from the ring: no effect
  EXPECT_EQ(flight.entries().front().sequence, 7u);
}

}  // namespace
}  // namespace ddp
