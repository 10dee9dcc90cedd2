// The span recorder, the Chrome trace writer and the gather to rank 0.
#include "engine/telemetry/timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "collectives/communicator.h"
#include "runtime/error.h"
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
    case SpanKind::kLayerBackward:
      return "backward layer";
    case SpanKind::kBucketAllReduce:
      return "all-reduce bucket";
    case SpanKind::kBackwardInput:
      return "backward input";
    case SpanKind::kBackwardWeight:
      return "backward weight";
    case SpanKind::kGather:
      return "gather layer";
    case SpanKind::kUnshard:
      return "unshard layer";
  }
  return "?";
}

double TimelineRecorder::now_us() {
  return wall_clock_ms() * 1e3;
}

void TimelineRecorder::add(SpanKind kind, int64_t step, int micro_batch, double start_us,
                           double end_us, int lane, int stage) {
  if (!on_) return;
  if (spans_.size() >= limit_) {
    ++dropped_;
    return;
  }
  spans_.push_back({kind, step, micro_batch, start_us, end_us, lane, stage});
}

std::string chrome_trace_json(const std::vector<std::vector<Span>>& rank_spans,
                              const std::vector<std::string>& track_names) {
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& spans : rank_spans)
    for (const Span& s : spans)
      origin = std::min(origin, s.start_us);
  nlohmann::json events = nlohmann::json::array();
  const size_t ranks = rank_spans.size();
  auto track = [&](size_t tid, const std::string& name) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 0},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 0},
                      {"tid", tid},
                      {"args", {{"sort_index", 3 * (tid % ranks) + tid / ranks}}}});
  };
  // A rank's tracks: its compute (lane 0), its collectives (1) and --zero 3's gathers (2).
  const char* kLaneNames[] = {"", " communication", " gathers"};
  for (size_t r = 0; r < ranks; ++r) {
    const std::string name = r < track_names.size() ? track_names[r] : "";
    track(r, name);
    for (int lane = 1; lane <= 2; ++lane)
      if (std::any_of(rank_spans[r].begin(), rank_spans[r].end(),
                      [lane](const Span& s) { return s.lane == lane; }))
        track(lane * ranks + r, name + kLaneNames[lane]);
    for (const Span& s : rank_spans[r]) {
      std::string name = span_name(s.kind);
      if (s.micro_batch >= 0) name += " " + std::to_string(s.micro_batch);
      if (s.stage >= 0) name += " (stage " + std::to_string(s.stage) + ")";
      nlohmann::json args = {{"step", s.step}, {"micro_batch", s.micro_batch}};
      if (s.stage >= 0) args["stage"] = s.stage;
      events.push_back({{"ph", "X"},
                        {"name", name},
                        {"cat", span_name(s.kind)},
                        {"pid", 0},
                        {"tid", (s.lane == 1 || s.lane == 2 ? s.lane : 0) * ranks + r},
                        {"ts", s.start_us - origin},
                        {"dur", std::max(0.0, s.end_us - s.start_us)},
                        {"args", args}});
    }
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void write_chrome_trace(const std::string& path, const std::vector<std::vector<Span>>& rank_spans,
                        const std::vector<std::string>& track_names) {
  const std::string temp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(temp, std::ios::binary);
    out << chrome_trace_json(rank_spans, track_names);
    out.close();
    written = !out.fail();
  }
  const int error = written && std::rename(temp.c_str(), path.c_str()) == 0 ? 0 : errno;
  if (error != 0 || !written) std::remove(temp.c_str());  // no stray temporary file
  DDP_USAGE_CHECK(written, "--timeline {}: could not write {}", path, temp);
  DDP_USAGE_CHECK(error == 0, "--timeline {}: could not rename {} over it ({})", path, temp,
                  std::strerror(error));
}

std::vector<double> pack_spans(const std::vector<Span>& spans) {
  std::vector<double> packed;
  for (const Span& s : spans)
    packed.insert(packed.end(), {static_cast<double>(s.kind), static_cast<double>(s.step),
                                 static_cast<double>(s.micro_batch), s.start_us, s.end_us,
                                 static_cast<double>(s.lane), static_cast<double>(s.stage)});
  return packed;
}

std::vector<Span> unpack_spans(const std::vector<double>& packed) {
  std::vector<Span> spans;
  for (size_t i = 0; i + kSpanDoubles <= packed.size(); i += kSpanDoubles)
    spans.push_back({static_cast<SpanKind>(static_cast<int>(packed[i])),
                     static_cast<int64_t>(packed[i + 1]), static_cast<int>(packed[i + 2]),
                     packed[i + 3], packed[i + 4], static_cast<int>(packed[i + 5]),
                     static_cast<int>(packed[i + 6])});
  return spans;
}

std::vector<std::vector<Span>> gather_spans(Communicator* comm, const std::vector<Span>& mine) {
  if (comm == nullptr || comm->size() == 1) return {mine};
  std::vector<double> packed = pack_spans(mine);
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
    std::vector<double> theirs(static_cast<size_t>(counts[r]) * kSpanDoubles);
    comm->recv(theirs.data(), theirs.size(), DataType::kFloat64, r);
    all[r] = unpack_spans(theirs);
  }
  return all;
}

}  // namespace ddp
