// What each rank did when: spans of forward, backward, send, recv, all-reduce and optimizer
// work recorded by the training loop, gathered to rank 0 and written as a Chrome trace
// (one track per rank) that chrome://tracing and Perfetto open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

class Communicator;

// kLayerBackward and kBucketAllReduce: the GPU's spans inside a step, numbered by layer and
// by gradient bucket (in the index field).
enum class SpanKind {
  kForward,
  kBackward,
  kSend,
  kRecv,
  kAllReduce,
  kOptimizer,
  kLayerBackward,
  kBucketAllReduce,
  kBackwardInput,   // a backward split in two (zero-bubble schedules): the input half
  kBackwardWeight,  // and the weight half
  kGather,          // --zero 3: a layer's parameters gathered before its use (lane 2)
  kUnshard          // --zero 3: the same, started by the schedule's kUnshard (lane 2)
};
const char* span_name(SpanKind kind);

struct Span {
  SpanKind kind = SpanKind::kForward;
  int64_t step = 0;      // 1-based optimizer step
  int micro_batch = -1;  // -1: not of one micro-batch; the layer or bucket of the GPU's kinds
  double start_us = 0;   // wall clock, microseconds since the epoch (comparable across ranks)
  double end_us = 0;
  // 0: the rank's work; 1: its communication running beside it (GPU); 2: --zero 3's gathers
  int lane = 0;
  int stage = -1;  // the pipeline stage it belongs to, where a rank runs several (-1: its one)
};

class TimelineRecorder {
 public:
  // Records nothing unless `on`; keeps at most `limit` spans (the rest are counted).
  explicit TimelineRecorder(bool on = false, size_t limit = 200000) : on_(on), limit_(limit) {}
  bool on() const { return on_; }
  static double now_us();
  void add(SpanKind kind, int64_t step, int micro_batch, double start_us, double end_us,
           int lane = 0, int stage = -1);
  const std::vector<Span>& spans() const { return spans_; }
  size_t dropped() const { return dropped_; }

 private:
  bool on_;
  size_t limit_;
  std::vector<Span> spans_;
  size_t dropped_ = 0;
};

// The Chrome trace JSON of every rank's spans (rank_spans[r]), track r named
// track_names[r] (lane 1 on track ranks + r, "... communication"; lane 2 on track 2 x ranks + r,
// "... gathers"), times relative to the
// earliest span. Pure.
std::string chrome_trace_json(const std::vector<std::vector<Span>>& rank_spans,
                              const std::vector<std::string>& track_names);

// Spans as doubles (kSpanDoubles each: kind, step, micro-batch, start, end, lane, stage; exact),
// for collectives; and back.
constexpr size_t kSpanDoubles = 7;
std::vector<double> pack_spans(const std::vector<Span>& spans);
std::vector<Span> unpack_spans(const std::vector<double>& packed);

// Writes chrome_trace_json(rank_spans, track_names) to `path` whole (a temporary file
// renamed into place); throws naming the flag and the path when it cannot.
void write_chrome_trace(const std::string& path, const std::vector<std::vector<Span>>& rank_spans,
                        const std::vector<std::string>& track_names);

// Collective over `comm` (host buffers): rank 0 receives every rank's spans (index = rank);
// the others get an empty list. With a null communicator: this rank's alone.
std::vector<std::vector<Span>> gather_spans(Communicator* comm, const std::vector<Span>& mine);

}  // namespace ddp
