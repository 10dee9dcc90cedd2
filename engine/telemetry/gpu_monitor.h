// The GPU monitor: a background thread samples this rank's GPU through NVML (never a CUDA
// call, so the training stream is untouched) and the training loop takes one summary per
// logging window: mean and max of utilization, memory, power, temperature and SM clock and
// the throttle reasons seen. The window statistics, their packing for a gather across ranks
// and the warning rules are pure functions, tested on recorded samples.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/nvml.h"

namespace ddp {

// Mean and max of a field over a window; negative when no sample had it.
struct FieldStats {
  double mean = -1;
  double max = -1;
};

struct GpuWindow {
  int samples = 0;  // readings in the window; -1: this rank has no monitor
  FieldStats util_pct, mem_used_mib, power_w, temp_c, sm_clock_mhz;
  double mem_total_mib = -1;
  double power_limit_w = -1;
  uint64_t throttle = 0;  // every reason seen in the window (OR)
};

// Running sums for a window or the whole run.
class GpuStatsAccumulator {
 public:
  void add(const GpuSample& sample);
  GpuWindow result() const;
  int count() const { return count_; }

 private:
  struct Field {
    double sum = 0;
    double max = -1;
    int count = 0;
    void add(double value);
    FieldStats stats() const;
  };
  int count_ = 0;
  Field util_, mem_, power_, temp_, clock_;
  double mem_total_ = -1, power_limit_ = -1;
  uint64_t throttle_ = 0;
};

GpuWindow summarize(const std::vector<GpuSample>& samples);  // Pure.

// A window as kGpuWindowFields doubles (for a sum-based gather across ranks) and back.
constexpr int kGpuWindowFields = 15;
void pack_window(const GpuWindow& window, double* out);
GpuWindow unpack_window(const double* in);

// The warnings for this window of every rank (index = rank), each cause once per rank
// (`warned` remembers what was said): a GPU under 50 % busy while another is over 80 %
// (a straggler or a starved input), thermal or power throttling, memory within 5 % of the
// total. Pure.
std::vector<std::string> gpu_warnings(const std::vector<GpuWindow>& ranks,
                                      std::set<std::string>* warned);

// The metrics' "gpu" object: per field, mean and max lists indexed by rank; "throttle" the
// names per rank. Pure.
nlohmann::json gpu_windows_json(const std::vector<GpuWindow>& ranks);
// "gpu 97% 12.3/140.4 GiB 410 W 55 C" for the progress line ("" without samples). Pure.
std::string gpu_compact(const GpuWindow& window);
// The end-of-run table, one line per rank (mean utilization, peak memory, peak temperature,
// peak power, throttle reasons). Pure.
std::vector<std::string> gpu_summary_table(const std::vector<GpuWindow>& ranks);

class GpuMonitor {
 public:
  // Samples the GPU with this UUID ("GPU-...") every period_s; when NVML or the GPU is not
  // there, available() is false and why() says why (the thread is not started).
  explicit GpuMonitor(const std::string& uuid, double period_s = 0.1);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const { return handle_ != nullptr; }
  const std::string& why() const { return why_; }
  double period_s() const { return period_s_; }
  // Training starts: the windows and the whole-run figures count from here (start-up,
  // data loading and compilation are left out).
  void begin_training();
  // The samples since the last call (with none yet, the latest reading alone, samples = 0).
  GpuWindow take_window();
  // Every sample since the start; at least one (taken now when training was shorter than
  // the first reading).
  GpuWindow whole_run();

 private:
  void run();

  Nvml nvml_;
  void* handle_ = nullptr;
  std::string why_;
  double period_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  GpuStatsAccumulator window_, run_;
  GpuSample latest_;
  bool have_latest_ = false;
  std::thread thread_;
};

}  // namespace ddp
