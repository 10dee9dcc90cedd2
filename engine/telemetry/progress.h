// Progress reporting shared by the CPU and GPU training loops: one log line and one metrics
// record per window of steps, and the end-of-run summary.
#pragma once

#include <cstdint>

#include "engine/telemetry/metrics.h"
#include "engine/telemetry/train_result.h"
#include "models/optimizer.h"  // LrSchedule
#include "runtime/timer.h"

namespace ddp {

// What the reports need of a run's settings (the loop takes them from its flags), so that
// telemetry reads no flag table.
struct ProgressOptions {
  int batch_size = 0;  // samples a step (the epoch count in each line)
  float lr = 0;        // the base learning rate, its schedule and warm-up (each line's lr)
  LrSchedule lr_schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;
  bool quiet = false;        // no log lines (the records are still written)
  double start_time_ms = 0;  // the launch's wall clock (ms) for the first step's line, or 0
};

class ProgressReporter {
 public:
  ProgressReporter(const ProgressOptions& options, int64_t total_steps, int64_t samples_per_epoch,
                   MetricsWriter* metrics);
  // A window of steps ended at `step` (1-based count of steps done): its summed loss, hits and
  // samples. Updates result's train loss/accuracy.
  // `extra` fields join the step record and `note` the log line (the GPU monitor's).
  void window(int64_t step, double loss_sum, int64_t correct, int64_t samples, TrainResult* result,
              const nlohmann::json& extra = nullptr, const std::string& note = "");
  // The first step has finished (its results are on the host): logs and records how long
  // after the launch (or the process start) that was.
  void first_step_done();
  // A mid-run evaluation of the test split after `step` steps (sums over every rank).
  void evaluation(int64_t step, double loss_sum, int64_t correct, int64_t samples);
  // Logs and records the end of the run (result.test must be filled); train_seconds is the
  // training loop's time, evaluation excluded.
  void finish(double train_seconds, TrainResult* result);
  double seconds() const { return clock_.seconds(); }

 private:
  ProgressOptions config_;
  int64_t total_steps_;
  int64_t samples_per_epoch_;
  MetricsWriter* metrics_;
  Stopwatch clock_;
  Stopwatch window_clock_;
  int64_t total_samples_ = 0;
  int windows_ = 0;
  double steady_samples_ = 0;  // samples after the first window (warm-up excluded)
  double steady_seconds_ = 0;
};

}  // namespace ddp
