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
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace ddp
