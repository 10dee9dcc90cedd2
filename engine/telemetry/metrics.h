// The metrics file: one JSON object per line (JSON Lines), flushed after each line so that
// a crashed run keeps what it logged.
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace ddp {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing
  // `append`: keep the records already there (a resumed or restarted run adds to its
  // history instead of erasing it).
  explicit MetricsWriter(const std::string& path, bool append = false);
  bool enabled() const { return out_.is_open(); }
  // Writes one record, adding "time" (UTC, ISO 8601 with milliseconds) unless it has one,
  // and "elapsed_s" (seconds since this writer was made, i.e. since the run started).
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
  double start_ms_ = 0;  // wall clock when opened
};

// "2026-11-29T17:55:02.123Z" for a wall-clock time in ms since the epoch.
std::string iso_time(double wall_ms);

}  // namespace ddp
