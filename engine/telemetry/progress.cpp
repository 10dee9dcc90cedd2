// ProgressReporter: log lines and metrics records.
#include "engine/telemetry/progress.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine/telemetry/train_result.h"

namespace ddp {

ProgressReporter::ProgressReporter(const ProgressOptions& config, int64_t total_steps,
                                   int64_t samples_per_epoch, MetricsWriter* metrics)
    : config_(config),
      total_steps_(total_steps),
      samples_per_epoch_(samples_per_epoch),
      metrics_(metrics) {}

void ProgressReporter::window(int64_t step, double loss_sum, int64_t correct, int64_t samples,
                              TrainResult* result, const nlohmann::json& extra,
                              const std::string& note) {
  const double window_seconds = std::max(window_clock_.seconds(), 1e-9);
  window_clock_.reset();
  const double elapsed = clock_.seconds();
  const double rate = samples / window_seconds;
  if (windows_++ > 0) steady_samples_ += samples, steady_seconds_ += window_seconds;
  total_samples_ += samples;
  const double eta = elapsed / step * (total_steps_ - step);
  result->train_loss = loss_sum / std::max<int64_t>(samples, 1);
  result->train_accuracy = static_cast<double>(correct) / std::max<int64_t>(samples, 1);
  const int64_t epoch = (step - 1) * config_.batch_size / samples_per_epoch_ + 1;
  const float lr =
      lr_at(step - 1, total_steps_, config_.lr, config_.lr_schedule, config_.warmup_steps);
  if (!config_.quiet)
    spdlog::info(
        "epoch {} step {}/{} loss {:.4f} acc {:.2f}% lr {:.4g} {:.1f}k samples/s, {:.0f}s left{}",
        epoch, step, total_steps_, result->train_loss, 100 * result->train_accuracy, lr, rate / 1e3,
        eta, note.empty() ? "" : ", " + note);
  if (metrics_) {
    nlohmann::json record = {{"event", "step"},
                             {"step", step},
                             {"epoch", epoch},
                             {"loss", result->train_loss},
                             {"accuracy", result->train_accuracy},
                             {"lr", lr},
                             {"samples_per_s", rate},
                             {"train_s", elapsed}};
    if (extra.is_object()) record.update(extra);
    metrics_->write(record);
  }
}

void ProgressReporter::evaluation(int64_t step, double loss_sum, int64_t correct, int64_t samples) {
  if (samples <= 0) return;
  const double loss = loss_sum / static_cast<double>(samples);
  const double accuracy = static_cast<double>(correct) / static_cast<double>(samples);
  if (!config_.quiet)
    spdlog::info("eval at step {}: test loss {:.4f}, accuracy {:.2f}% ({} samples)", step, loss,
                 100 * accuracy, samples);
  if (metrics_)
    metrics_->write({{"event", "eval"},
                     {"step", step},
                     {"test_loss", loss},
                     {"test_accuracy", accuracy},
                     {"test_samples", samples}});
}

void ProgressReporter::first_step_done() {
  if (config_.start_time_ms <= 0) return;
  const double since = (wall_clock_ms() - config_.start_time_ms) / 1e3;
  spdlog::info("first step finished {:.2f}s after launch", since);
  if (metrics_) metrics_->write({{"event", "first_step"}, {"since_launch_s", since}});
}

void ProgressReporter::finish(double train_seconds, TrainResult* result) {
  result->seconds = train_seconds;
  result->samples_per_second = total_samples_ / std::max(result->seconds, 1e-9);
  const double steady =
      steady_seconds_ > 0 ? steady_samples_ / steady_seconds_ : result->samples_per_second;
  if (result->test.samples > 0)
    spdlog::info(
        "test accuracy {:.2f}% (loss {:.4f}, {} samples); trained {} steps in {:.2f}s, "
        "{:.1f}k samples/s ({:.1f}k after the first window)",
        100 * result->test.accuracy, result->test.loss, result->test.samples, result->steps,
        result->seconds, result->samples_per_second / 1e3, steady / 1e3);
  else
    spdlog::info("trained {} steps in {:.2f}s, {:.1f}k samples/s ({:.1f}k after the first window)",
                 result->steps, result->seconds, result->samples_per_second / 1e3, steady / 1e3);
  if (metrics_)
    metrics_->write({{"event", "end"},
                     {"steps", result->steps},
                     {"train_loss", result->train_loss},
                     {"test_accuracy", result->test.accuracy},
                     {"test_loss", result->test.loss},
                     {"train_seconds", result->seconds},
                     {"samples_per_s", result->samples_per_second},
                     {"steady_samples_per_s", steady}});
}

}  // namespace ddp
