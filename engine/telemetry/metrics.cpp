// MetricsWriter: JSON Lines, one record per call.
#include "engine/telemetry/metrics.h"

#include <cerrno>
#include <cstring>

#include <sys/stat.h>

#include <cstdio>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

std::string iso_time(double wall_ms) {
  const auto whole = static_cast<std::time_t>(wall_ms / 1000);
  std::tm utc{};
  ::gmtime_r(&whole, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", text,
                     static_cast<int>(wall_ms - static_cast<double>(whole) * 1000));
}

namespace {
// A new run never erases an earlier run's records: they move to PATH.prev, said in a warning.
const std::string& keep_earlier(const std::string& path, bool append) {
  struct stat info {};
  if (!append && ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0) {
    const std::string kept = path + ".prev";
    DDP_USAGE_CHECK(std::rename(path.c_str(), kept.c_str()) == 0,
                    "--metrics {}: holds an earlier run's records and cannot be moved to {} ({}); "
                    "give another path or --resume to append",
                    path, kept, std::strerror(errno));
    spdlog::warn("--metrics {}: held an earlier run's records; moved them to {}", path, kept);
  }
  return path;
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path),
      out_(keep_earlier(path, append), append ? std::ios::app : std::ios::trunc),
      start_ms_(wall_clock_ms()) {
  DDP_USAGE_CHECK(out_.is_open(), "--metrics {}: cannot create the file", path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  nlohmann::json stamped = record;
  const double now = wall_clock_ms();
  if (!stamped.contains("time")) stamped["time"] = iso_time(now);
  stamped["elapsed_s"] = (now - start_ms_) / 1000.0;
  errno = 0;
  out_ << stamped.dump() << '\n';
  out_.flush();
  DDP_USAGE_CHECK(out_.good(), "--metrics {}: write failed ({})", path_,
                  errno != 0 ? std::strerror(errno) : "unknown reason");
}

}  // namespace ddp
