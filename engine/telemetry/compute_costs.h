// A rank's compute time by kind (forward, backward, its input half, its weight half), the one
// index of those kinds for every runner: the host's clock's on the CPU (the executor times each
// action), the device's events on the GPU (DeviceBusySpans). The simulator's costs and the
// end-of-run report are made from it.
#pragma once

#include <cstdint>

#include "engine/telemetry/timeline.h"

namespace ddp {

struct ComputeCosts {
  double seconds[4] = {0, 0, 0, 0};
  int64_t count[4] = {0, 0, 0, 0};

  // A compute span's index (forward 0, backward 1, input half 2, weight half 3), or -1.
  static int index(SpanKind kind) {
    switch (kind) {
      case SpanKind::kForward:
        return 0;
      case SpanKind::kBackward:
        return 1;
      case SpanKind::kBackwardInput:
        return 2;
      case SpanKind::kBackwardWeight:
        return 3;
      default:
        return -1;
    }
  }
  // One span of `kind` that took `s` seconds (not compute: nothing).
  void add(SpanKind kind, double s) {
    const int i = index(kind);
    if (i < 0) return;
    seconds[i] += s;
    ++count[i];
  }
  void add(const ComputeCosts& other) {
    for (int i = 0; i < 4; ++i) {
      seconds[i] += other.seconds[i];
      count[i] += other.count[i];
    }
  }
  bool measured() const { return count[0] > 0; }
  double total_seconds() const { return seconds[0] + seconds[1] + seconds[2] + seconds[3]; }
};

}  // namespace ddp
