// GpuMonitor's sampling thread and the pure window statistics and rules.
#include "engine/telemetry/gpu_monitor.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace ddp {

void GpuStatsAccumulator::Field::add(double value) {
  if (value < 0) return;  // NVML could not read it
  sum += value;
  max = std::max(max, value);
  ++count;
}

FieldStats GpuStatsAccumulator::Field::stats() const {
  if (count == 0) return {};
  return {sum / count, max};
}

void GpuStatsAccumulator::add(const GpuSample& s) {
  ++count_;
  util_.add(s.util_pct);
  mem_.add(s.mem_used_mib);
  power_.add(s.power_w);
  temp_.add(s.temp_c);
  clock_.add(s.sm_clock_mhz);
  if (s.mem_total_mib > 0) mem_total_ = s.mem_total_mib;
  if (s.power_limit_w > 0) power_limit_ = s.power_limit_w;
  throttle_ |= s.throttle;
}

GpuWindow GpuStatsAccumulator::result() const {
  GpuWindow w;
  w.samples = count_;
  w.util_pct = util_.stats();
  w.mem_used_mib = mem_.stats();
  w.power_w = power_.stats();
  w.temp_c = temp_.stats();
  w.sm_clock_mhz = clock_.stats();
  w.mem_total_mib = mem_total_;
  w.power_limit_w = power_limit_;
  w.throttle = throttle_;
  return w;
}

GpuWindow summarize(const std::vector<GpuSample>& samples) {
  GpuStatsAccumulator a;
  for (const GpuSample& s : samples)
    a.add(s);
  return a.result();
}

void pack_window(const GpuWindow& w, double* out) {
  const double values[kGpuWindowFields] = {static_cast<double>(w.samples),
                                           w.util_pct.mean,
                                           w.util_pct.max,
                                           w.mem_used_mib.mean,
                                           w.mem_used_mib.max,
                                           w.power_w.mean,
                                           w.power_w.max,
                                           w.temp_c.mean,
                                           w.temp_c.max,
                                           w.sm_clock_mhz.mean,
                                           w.sm_clock_mhz.max,
                                           w.mem_total_mib,
                                           w.power_limit_w,
                                           static_cast<double>(w.throttle & 0xffffffffu),
                                           static_cast<double>(w.throttle >> 32)};
  std::copy(values, values + kGpuWindowFields, out);
}

GpuWindow unpack_window(const double* in) {
  GpuWindow w;
  w.samples = static_cast<int>(in[0]);
  w.util_pct = {in[1], in[2]};
  w.mem_used_mib = {in[3], in[4]};
  w.power_w = {in[5], in[6]};
  w.temp_c = {in[7], in[8]};
  w.sm_clock_mhz = {in[9], in[10]};
  w.mem_total_mib = in[11];
  w.power_limit_w = in[12];
  w.throttle = static_cast<uint64_t>(in[13]) | (static_cast<uint64_t>(in[14]) << 32);
  return w;
}

std::vector<std::string> gpu_warnings(const std::vector<GpuWindow>& ranks,
                                      std::set<std::string>* warned) {
  std::vector<std::string> out;
  auto once = [&](int rank, const char* cause, std::string message) {
    if (warned->insert(fmt::format("{}/{}", rank, cause)).second) out.push_back(std::move(message));
  };
  // The busiest other GPU, for the straggler rule.
  for (size_t r = 0; r < ranks.size(); ++r) {
    const GpuWindow& w = ranks[r];
    if (w.samples <= 0) continue;
    const int rank = static_cast<int>(r);
    if (w.util_pct.mean >= 0 && w.util_pct.mean < 50) {
      int busiest = -1;
      for (size_t k = 0; k < ranks.size(); ++k)
        if (k != r && ranks[k].samples > 0 && ranks[k].util_pct.mean >= 80 &&
            (busiest < 0 || ranks[k].util_pct.mean > ranks[busiest].util_pct.mean))
          busiest = static_cast<int>(k);
      if (busiest >= 0)
        once(rank, "idle",
             fmt::format("rank {}: GPU {:.0f}% busy over the window while rank {}'s is {:.0f}%: "
                         "a straggler or a starved input (check its data loading and host)",
                         rank, w.util_pct.mean, busiest, ranks[busiest].util_pct.mean));
    }
    if (w.throttle & kThrottleThermal)
      once(rank, "thermal",
           fmt::format("rank {}: GPU thermally throttled ({}) at up to {:.0f} C", rank,
                       throttle_names(w.throttle & kThrottleThermal), w.temp_c.max));
    if (w.throttle & kThrottlePower)
      once(rank, "power",
           fmt::format(
               "rank {}: GPU clocks held by its power limit ({}) at up to {:.0f} W of {:.0f} W",
               rank, throttle_names(w.throttle & kThrottlePower), w.power_w.max, w.power_limit_w));
    if (w.mem_total_mib > 0 && w.mem_used_mib.max >= 0.95 * w.mem_total_mib)
      once(rank, "memory",
           fmt::format("rank {}: GPU memory {:.0f} of {:.0f} MiB in use, within 5% of full (every "
                       "process on the GPU counted)",
                       rank, w.mem_used_mib.max, w.mem_total_mib));
  }
  return out;
}

nlohmann::json gpu_windows_json(const std::vector<GpuWindow>& ranks) {
  auto field = [&](FieldStats GpuWindow::*member) {
    nlohmann::json mean = nlohmann::json::array(), max = nlohmann::json::array();
    for (const GpuWindow& w : ranks) {
      const FieldStats& f = w.*member;
      mean.push_back(f.mean >= 0 ? nlohmann::json(f.mean) : nlohmann::json(nullptr));
      max.push_back(f.max >= 0 ? nlohmann::json(f.max) : nlohmann::json(nullptr));
    }
    return nlohmann::json{{"mean", mean}, {"max", max}};
  };
  nlohmann::json throttle = nlohmann::json::array(), samples = nlohmann::json::array(),
                 total = nlohmann::json::array();
  for (const GpuWindow& w : ranks) {
    throttle.push_back(throttle_names(w.throttle));
    samples.push_back(w.samples);
    total.push_back(w.mem_total_mib >= 0 ? nlohmann::json(w.mem_total_mib)
                                         : nlohmann::json(nullptr));
  }
  return {{"util", field(&GpuWindow::util_pct)},
          {"mem_used_mib", field(&GpuWindow::mem_used_mib)},
          {"mem_total_mib", total},
          {"power_w", field(&GpuWindow::power_w)},
          {"temp_c", field(&GpuWindow::temp_c)},
          {"sm_clock_mhz", field(&GpuWindow::sm_clock_mhz)},
          {"throttle", throttle},
          {"samples", samples}};
}

std::string gpu_compact(const GpuWindow& w) {
  if (w.samples < 0 || w.util_pct.mean < 0) return "";
  std::string text = fmt::format("gpu {:.0f}%", w.util_pct.mean);
  if (w.mem_used_mib.max >= 0)
    text += fmt::format(" {:.1f}/{:.1f} GiB", w.mem_used_mib.max / 1024, w.mem_total_mib / 1024);
  if (w.power_w.mean >= 0) text += fmt::format(" {:.0f} W", w.power_w.mean);
  if (w.temp_c.max >= 0) text += fmt::format(" {:.0f} C", w.temp_c.max);
  if (w.throttle & (kThrottleThermal | kThrottlePower | kThrottleHwSlowdown)) text += " throttled";
  return text;
}

std::vector<std::string> gpu_summary_table(const std::vector<GpuWindow>& ranks) {
  std::vector<std::string> lines = {fmt::format("{:>4}  {:>9}  {:>17}  {:>9}  {:>10}  {}", "rank",
                                                "mean util", "peak memory", "peak temp",
                                                "peak power", "throttled")};
  for (size_t r = 0; r < ranks.size(); ++r) {
    const GpuWindow& w = ranks[r];
    if (w.samples <= 0) {
      lines.push_back(fmt::format("{:>4}  no samples", r));
      continue;
    }
    lines.push_back(
        fmt::format("{:>4}  {:>8.0f}%  {:>7.1f} of {:>5.1f} GiB  {:>7.0f} C  {:>8.0f} W  {}", r,
                    w.util_pct.mean, w.mem_used_mib.max / 1024, w.mem_total_mib / 1024,
                    w.temp_c.max, w.power_w.max,
                    w.throttle & (kThrottleThermal | kThrottlePower | kThrottleHwSlowdown)
                        ? throttle_names(w.throttle)
                        : "-"));
  }
  return lines;
}

GpuMonitor::GpuMonitor(const std::string& uuid, double period_s) : period_s_(period_s) {
  if (!nvml_.available()) {
    why_ = nvml_.why();
    return;
  }
  handle_ = nvml_.handle_by_uuid(uuid);
  if (handle_ == nullptr) {
    why_ = fmt::format("NVML does not know the GPU {}", uuid);
    return;
  }
  thread_ = std::thread([this] { run(); });
}

GpuMonitor::~GpuMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GpuMonitor::run() {
  const auto period = std::chrono::duration<double>(period_s_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    const GpuSample sample = nvml_.sample(handle_);  // outside the lock: NVML takes time
    lock.lock();
    window_.add(sample);
    run_.add(sample);
    latest_ = sample;
    have_latest_ = true;
    wake_.wait_for(lock, period, [this] { return stop_; });
  }
}

void GpuMonitor::begin_training() {
  std::lock_guard<std::mutex> lock(mutex_);
  window_ = GpuStatsAccumulator();
  run_ = GpuStatsAccumulator();
}

GpuWindow GpuMonitor::take_window() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (handle_ == nullptr) {
    GpuWindow none;
    none.samples = -1;
    return none;
  }
  if (window_.count() == 0) {
    GpuStatsAccumulator latest;
    if (have_latest_) latest.add(latest_);
    GpuWindow w = latest.result();
    w.samples = 0;
    return w;
  }
  const GpuWindow w = window_.result();
  window_ = GpuStatsAccumulator();
  return w;
}

GpuWindow GpuMonitor::whole_run() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (handle_ == nullptr) {
    GpuWindow none;
    none.samples = -1;
    return none;
  }
  if (run_.count() == 0) {
    // Training ended before the sampler's first reading landed (a short run on a busy host,
    // where one NVML reading can take longer than the run): one reading now, the GPU as
    // training left it, rather than a summary of nothing.
    lock.unlock();
    const GpuSample sample = nvml_.sample(handle_);  // NVML is thread-safe
    lock.lock();
    if (run_.count() == 0) run_.add(sample);
  }
  return run_.result();
}

}  // namespace ddp
