// The span recorder, the Chrome trace writer and the gather to rank 0.
#include "engine/timeline.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "collectives/communicator.h"
#include "runtime/timer.h"

namespace ddp {

const char* span_name(SpanKind kind) {
  switch (kind) {
    case SpanKind::kForward:
      return "forward";
    case SpanKind::kBackward:
      return "backward";
    case SpanKind::kSend:
      return "send";
    case SpanKind::kRecv:
      return "recv";
    case SpanKind::kAllReduce:
      return "all-reduce";
    case SpanKind::kOptimizer:
      return "optimizer";
  }
  return "?";
}

double TimelineRecorder::now_us() {
  return wall_clock_ms() * 1e3;
}

void TimelineRecorder::add(SpanKind kind, int64_t step, int micro_batch, double start_us,
                           double end_us) {
  if (!on_) return;
  if (spans_.size() >= limit_) {
    ++dropped_;
    return;
  }
  spans_.push_back({kind, step, micro_batch, start_us, end_us});
}

std::string chrome_trace_json(const std::vector<std::vector<Span>>& rank_spans,
                              const std::vector<std::string>& track_names) {
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& spans : rank_spans)
    for (const Span& s : spans)
      origin = std::min(origin, s.start_us);
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < rank_spans.size(); ++r) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", r < track_names.size() ? track_names[r] : ""}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"sort_index", r}}}});
    for (const Span& s : rank_spans[r]) {
      std::string name = span_name(s.kind);
      if (s.micro_batch >= 0) name += " " + std::to_string(s.micro_batch);
      events.push_back({{"ph", "X"},
                        {"name", name},
                        {"cat", span_name(s.kind)},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", s.start_us - origin},
                        {"dur", std::max(0.0, s.end_us - s.start_us)},
                        {"args", {{"step", s.step}, {"micro_batch", s.micro_batch}}}});
    }
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

std::vector<std::vector<Span>> gather_spans(Communicator* comm, const std::vector<Span>& mine) {
  if (comm == nullptr || comm->size() == 1) return {mine};
  // Five doubles a span: kind, step, micro-batch, start, end (all exact in a double).
  std::vector<double> packed;
  for (const Span& s : mine)
    packed.insert(packed.end(), {static_cast<double>(s.kind), static_cast<double>(s.step),
                                 static_cast<double>(s.micro_batch), s.start_us, s.end_us});
  const int64_t count = static_cast<int64_t>(mine.size());
  std::vector<int64_t> counts(comm->size());
  comm->all_gather(&count, counts.data(), 1, DataType::kInt64);
  if (comm->rank() != 0) {
    if (count > 0) comm->send(packed.data(), packed.size(), DataType::kFloat64, 0);
    return {};
  }
  std::vector<std::vector<Span>> all(comm->size());
  all[0] = mine;
  for (int r = 1; r < comm->size(); ++r) {
    if (counts[r] == 0) continue;
    std::vector<double> theirs(static_cast<size_t>(counts[r]) * 5);
    comm->recv(theirs.data(), theirs.size(), DataType::kFloat64, r);
    for (size_t i = 0; i < theirs.size(); i += 5)
      all[r].push_back({static_cast<SpanKind>(static_cast<int>(theirs[i])),
                        static_cast<int64_t>(theirs[i + 1]), static_cast<int>(theirs[i + 2]),
                        theirs[i + 3], theirs[i + 4]});
  }
  return all;
}

}  // namespace ddp
