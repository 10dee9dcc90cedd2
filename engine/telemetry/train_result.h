// What a run reports at its end: the training loss and accuracy of the last window, the
// test split's evaluation, the time and the throughput. Its own header, so that the
// telemetry that fills it need not include the trainer.
#pragma once

#include <cstdint>

namespace ddp {

struct EvalResult {
  double loss = 0;      // mean over the split
  double accuracy = 0;  // fraction in [0, 1]
  int64_t samples = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double train_loss = 0;      // mean over the last logging window (all ranks)
  double train_accuracy = 0;  // fraction, same window
  EvalResult test;
  double seconds = 0;  // training loop only
  double samples_per_second = 0;
};

}  // namespace ddp
