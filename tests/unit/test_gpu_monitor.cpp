// The GPU monitor's pure parts on recorded samples: window statistics (fields NVML could
// not read left out), packing for the gather across ranks, the warning rules (each cause
// once per rank), the metrics object, the progress-line field and the end table.
#include <gtest/gtest.h>

#include "engine/telemetry/gpu_monitor.h"

namespace ddp {
namespace {

GpuSample reading(double util, double mem, double power, double temp, uint64_t throttle = 0) {
  GpuSample s;
  s.util_pct = util;
  s.mem_used_mib = mem;
  s.mem_total_mib = 143771;
  s.power_w = power;
  s.power_limit_w = 700;
  s.temp_c = temp;
  s.sm_clock_mhz = 1980;
  s.throttle = throttle;
  return s;
}

TEST(GpuMonitorStats, MeanAndMaxPerFieldUnreadFieldsLeftOut) {
  GpuSample unread = reading(-1, 2000, -1, 50);
  const GpuWindow w = summarize(
      {reading(90, 1000, 400, 40, kThrottlePowerCap), reading(100, 3000, 500, 60), unread});
  EXPECT_EQ(w.samples, 3);
  EXPECT_DOUBLE_EQ(w.util_pct.mean, 95);  // the unread reading is not a zero
  EXPECT_DOUBLE_EQ(w.util_pct.max, 100);
  EXPECT_DOUBLE_EQ(w.mem_used_mib.mean, 2000);
  EXPECT_DOUBLE_EQ(w.mem_used_mib.max, 3000);
  EXPECT_DOUBLE_EQ(w.power_w.mean, 450);
  EXPECT_DOUBLE_EQ(w.temp_c.max, 60);
  EXPECT_DOUBLE_EQ(w.mem_total_mib, 143771);
  EXPECT_EQ(w.throttle, kThrottlePowerCap);
  const GpuWindow none = summarize({});
  EXPECT_EQ(none.samples, 0);
  EXPECT_LT(none.util_pct.mean, 0);
  EXPECT_EQ(gpu_compact(none), "");
}

TEST(GpuMonitorStats, PackedWindowsRoundTripThroughASum) {
  GpuWindow w = summarize({reading(80, 1024, 300, 45, kThrottleHwThermal | (1ull << 40))});
  // The gather adds zeros from the other ranks' slots: a packed window survives that.
  double slots[2 * kGpuWindowFields] = {};
  pack_window(w, slots + kGpuWindowFields);
  const GpuWindow back = unpack_window(slots + kGpuWindowFields);
  EXPECT_EQ(back.samples, 1);
  EXPECT_DOUBLE_EQ(back.util_pct.mean, 80);
  EXPECT_DOUBLE_EQ(back.mem_used_mib.max, 1024);
  EXPECT_DOUBLE_EQ(back.power_limit_w, 700);
  EXPECT_EQ(back.throttle, kThrottleHwThermal | (1ull << 40));
  EXPECT_EQ(unpack_window(slots).samples, 0);  // an empty slot is a rank without samples
}

TEST(GpuMonitorRules, EachCauseOncePerRankNamingTheRank) {
  std::set<std::string> warned;
  const GpuWindow busy = summarize({reading(97, 5000, 450, 50)});
  const GpuWindow starved = summarize({reading(20, 5000, 150, 40)});
  const GpuWindow hot = summarize({reading(95, 5000, 450, 88, kThrottleSwThermal)});
  const GpuWindow capped = summarize({reading(95, 5000, 699, 60, kThrottlePowerCap)});
  const GpuWindow full = summarize({reading(95, 140000, 450, 60)});
  auto first = gpu_warnings({busy, starved, hot, capped, full}, &warned);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_NE(first[0].find("rank 1: GPU 20% busy over the window while rank 0's is 97%"),
            std::string::npos)
      << first[0];
  EXPECT_NE(first[1].find("rank 2: GPU thermally throttled (sw thermal) at up to 88 C"),
            std::string::npos)
      << first[1];
  EXPECT_NE(first[2].find("rank 3: GPU clocks held by its power limit (power cap)"),
            std::string::npos)
      << first[2];
  EXPECT_NE(first[3].find("rank 4: GPU memory 140000 of 143771 MiB in use, within 5% of full"),
            std::string::npos)
      << first[3];
  // The same causes again: nothing new; a new cause on a rank: said once.
  EXPECT_TRUE(gpu_warnings({busy, starved, hot, capped, full}, &warned).empty());
  const GpuWindow starved_and_hot = summarize({reading(20, 5000, 150, 90, kThrottleHwThermal)});
  const auto later = gpu_warnings({busy, starved_and_hot}, &warned);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_NE(later[0].find("rank 1: GPU thermally throttled (hw thermal)"), std::string::npos);
}

TEST(GpuMonitorRules, QuietGpusAreNotStragglersWithoutABusyOneOrSamples) {
  std::set<std::string> warned;
  const GpuWindow low = summarize({reading(30, 5000, 150, 40)});
  const GpuWindow medium = summarize({reading(60, 5000, 150, 40)});
  EXPECT_TRUE(gpu_warnings({low}, &warned).empty());          // alone: nothing to compare
  EXPECT_TRUE(gpu_warnings({low, medium}, &warned).empty());  // nobody over 80 %
  GpuWindow no_samples = low;
  no_samples.samples = 0;  // a window shorter than the sampling period
  EXPECT_TRUE(gpu_warnings({no_samples, summarize({reading(99, 5000, 450, 50)})}, &warned).empty());
}

TEST(GpuMonitorReport, MetricsObjectCompactFieldAndEndTable) {
  GpuWindow absent;
  absent.samples = -1;  // a rank without NVML
  const GpuWindow w = summarize({reading(90, 2048, 400, 50), reading(100, 4096, 420, 55)});
  const nlohmann::json j = gpu_windows_json({w, absent});
  EXPECT_EQ(j["util"]["mean"][0], 95.0);
  EXPECT_EQ(j["util"]["max"][0], 100.0);
  EXPECT_TRUE(j["util"]["mean"][1].is_null());
  EXPECT_EQ(j["mem_used_mib"]["max"][0], 4096.0);
  EXPECT_EQ(j["samples"][1], -1);
  EXPECT_EQ(j["throttle"][0], "");
  EXPECT_EQ(gpu_compact(w), "gpu 95% 4.0/140.4 GiB 410 W 55 C");
  const auto table = gpu_summary_table({w, absent});
  ASSERT_EQ(table.size(), 3u);
  EXPECT_NE(table[1].find("95%"), std::string::npos) << table[1];
  EXPECT_NE(table[1].find("4.0 of 140.4 GiB"), std::string::npos) << table[1];
  EXPECT_NE(table[2].find("no samples"), std::string::npos) << table[2];
  EXPECT_EQ(throttle_names(kThrottlePowerCap | kThrottleSwThermal | 0x1), "power cap, sw thermal");
}

}  // namespace
}  // namespace ddp
