// FlightRecorder: the ring and its description.
#include "collectives/flight_recorder.h"

#include <fmt/format.h>

#include "collectives/communicator.h"

namespace ddp {

void FlightRecorder::started(uint64_t sequence, const char* op, size_t count, DataType type) {
  FlightEntry entry;
  entry.sequence = sequence;
  entry.op = op;
  entry.count = count;
  entry.type = type;
  entry.started = std::chrono::steady_clock::now();
  const std::lock_guard<std::mutex> lock(mutex_);
  OpTraffic& total = totals_[op];
  ++total.calls;
  total.bytes += count * dtype_bytes(type);
  ring_.push_back(std::move(entry));
  if (ring_.size() > kFlightEntries) ring_.pop_front();
}

void FlightRecorder::ended(uint64_t sequence, bool ok) {
  const auto now = std::chrono::steady_clock::now();
  const std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it)
    if (it->sequence == sequence) {
      it->ended = now;
      it->done = ok;
      it->failed = !ok;
      return;
    }
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return {ring_.begin(), ring_.end()};
}

std::map<std::string, OpTraffic> FlightRecorder::totals() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

std::string FlightRecorder::recent_before(uint64_t sequence, size_t most) const {
  const std::vector<FlightEntry> all = entries();
  const FlightEntry* stuck = nullptr;
  for (const FlightEntry& e : all)
    if (e.sequence == sequence) stuck = &e;
  const auto reference = stuck ? stuck->started : std::chrono::steady_clock::now();
  std::string text;
  size_t listed = 0;
  for (auto it = all.rbegin(); it != all.rend() && listed < most; ++it) {
    if (it->sequence >= sequence) continue;
    const auto seconds = [&](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(reference - t).count();
    };
    const std::string state =
        it->done ? fmt::format("done {:.1f} s before it", seconds(it->ended))
        : it->failed
            ? "failed"
            : fmt::format("issued {:.1f} s before it, not seen to end", seconds(it->started));
    text += fmt::format("{}{} #{} ({} x {}) {}", text.empty() ? "" : ", ", it->op, it->sequence,
                        it->count, dtype_name(it->type), state);
    ++listed;
  }
  return text;
}

}  // namespace ddp
