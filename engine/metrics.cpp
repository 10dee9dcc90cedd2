// MetricsWriter: JSON Lines, one record per call.
#include "engine/metrics.h"

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace ddp {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  DDP_USAGE_CHECK(out_.is_open(), "--metrics {}: cannot create the file", path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  errno = 0;
  out_ << record.dump() << '\n';
  out_.flush();
  DDP_USAGE_CHECK(out_.good(), "--metrics {}: write failed ({})", path_,
                  errno != 0 ? std::strerror(errno) : "unknown reason");
}

}  // namespace ddp
