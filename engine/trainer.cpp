// Trainer on the CPU. Batch t of the run is positions [t*B, (t+1)*B) of the sampler's stream.
#include "engine/trainer.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "models/gemm.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

Dataset load_dataset(const TrainConfig& config) {
  if (config.data == "fashion") return load_fashion_mnist(config.data_dir);
  if (config.data == "npy") return load_npy_dataset(config.data_dir);
  const MlpShape shape = parse_layers(config.layers);
  return make_synthetic(config.synthetic_samples,
                        std::max<int64_t>(1, config.synthetic_samples / 5), shape.input_width(),
                        shape.num_classes(), config.seed);
}

Trainer::Trainer(const TrainConfig& config, const Dataset& data)
    : config_(config),
      data_(data),
      model_(parse_layers(config.layers), config.batch_size),
      sampler_(data.train.n, config.seed, config.shuffle) {
  const MlpShape& shape = model_.shape();
  DDP_USAGE_CHECK(shape.input_width() == data.train.dim,
                  "--layers {}: the first width is {} but the {} data has {} features per sample",
                  config.layers, shape.input_width(), data.name, data.train.dim);
  DDP_USAGE_CHECK(shape.num_classes() >= data.classes,
                  "--layers {}: the last width is {} but the {} data has {} classes", config.layers,
                  shape.num_classes(), data.name, data.classes);
  set_cpu_threads(config.threads);
  if (config.init_weights.empty())
    init_params(shape, config.seed, model_.params());
  else
    load_mlp_weights(config.init_weights, shape, model_.params());
  optimizer_ = make_optimizer(config.optimizer, shape.param_count());
  total_steps_ =
      config.steps > 0
          ? config.steps
          : std::max<int64_t>(1, int64_t{config.epochs} * data.train.n / config.batch_size);
  batch_indices_.resize(config.batch_size);
  batch_x_.resize(static_cast<size_t>(config.batch_size) * data.train.dim);
  batch_y_.resize(config.batch_size);
}

void Trainer::gather_batch(int64_t begin, int count) {
  sampler_.indices(begin, count, batch_indices_.data());
  const int dim = data_.train.dim;
  for (int i = 0; i < count; ++i) {
    const int32_t index = batch_indices_[i];
    std::memcpy(&batch_x_[static_cast<size_t>(i) * dim],
                &data_.train.x[static_cast<size_t>(index) * dim], sizeof(float) * dim);
    batch_y_[i] = data_.train.y[index];
  }
}

StepStats Trainer::step() {
  const BatchSlice slice = rank_slice(step_, config_.batch_size, 0, 1);
  gather_batch(slice.begin, slice.count);
  model_.forward(batch_x_.data(), slice.count);
  const LossSum sum = model_.backward(batch_y_.data(), slice.count, 1.0f / slice.count);
  const float lr =
      lr_at(step_, total_steps_, config_.lr, config_.lr_schedule, config_.warmup_steps);
  optimizer_->step(model_.params(), model_.grads(), model_.shape().param_count(), lr);
  ++step_;
  return {sum.loss, sum.correct, slice.count};
}

EvalResult Trainer::evaluate(const Split& split) {
  EvalResult result;
  if (split.n == 0) return result;
  double loss = 0;
  int64_t correct = 0;
  const int classes = model_.shape().num_classes();
  for (int64_t begin = 0; begin < split.n; begin += config_.batch_size) {
    const int count = static_cast<int>(std::min<int64_t>(config_.batch_size, split.n - begin));
    const float* logits = model_.forward(&split.x[static_cast<size_t>(begin) * split.dim], count);
    const LossSum sum = softmax_xent_cpu(logits, &split.y[begin], count, classes, 0.0f, nullptr);
    loss += sum.loss;
    correct += sum.correct;
  }
  result.samples = split.n;
  result.loss = loss / static_cast<double>(split.n);
  result.accuracy = static_cast<double>(correct) / static_cast<double>(split.n);
  return result;
}

TrainResult Trainer::run() {
  MetricsWriter metrics =
      config_.metrics.empty() ? MetricsWriter() : MetricsWriter(config_.metrics);
  TrainResult result;
  Stopwatch clock;
  Stopwatch window_clock;
  double window_loss = 0;
  int64_t window_correct = 0;
  int64_t window_samples = 0;
  int64_t total_samples = 0;
  while (step_ < total_steps_) {
    const StepStats stats = step();
    window_loss += stats.loss_sum;
    window_correct += stats.correct;
    window_samples += stats.samples;
    total_samples += stats.samples;
    if (step_ % config_.log_every == 0 || step_ == total_steps_) {
      const double elapsed = clock.seconds();
      const double rate = window_samples / std::max(window_clock.seconds(), 1e-9);
      const double eta = elapsed / step_ * (total_steps_ - step_);
      result.train_loss = window_loss / window_samples;
      result.train_accuracy = static_cast<double>(window_correct) / window_samples;
      const int64_t epoch = sampler_.epoch_of((step_ - 1) * config_.batch_size);
      const float lr =
          lr_at(step_ - 1, total_steps_, config_.lr, config_.lr_schedule, config_.warmup_steps);
      if (!config_.quiet)
        spdlog::info(
            "epoch {} step {}/{} loss {:.4f} acc {:.2f}% lr {:.4g} {:.1f}k samples/s, {:.0f}s left",
            epoch + 1, step_, total_steps_, result.train_loss, 100 * result.train_accuracy, lr,
            rate / 1e3, eta);
      metrics.write({{"event", "step"},
                     {"step", step_},
                     {"epoch", epoch + 1},
                     {"loss", result.train_loss},
                     {"accuracy", result.train_accuracy},
                     {"lr", lr},
                     {"samples_per_s", rate},
                     {"elapsed_s", elapsed}});
      window_loss = 0;
      window_correct = 0;
      window_samples = 0;
      window_clock.reset();
    }
  }
  result.seconds = clock.seconds();
  result.steps = step_;
  result.samples_per_second = total_samples / std::max(result.seconds, 1e-9);
  result.test = evaluate(data_.test);
  if (data_.test.n > 0)
    spdlog::info(
        "test accuracy {:.2f}% (loss {:.4f}, {} samples); trained {} steps in {:.1f}s, "
        "{:.1f}k samples/s",
        100 * result.test.accuracy, result.test.loss, result.test.samples, result.steps,
        result.seconds, result.samples_per_second / 1e3);
  else
    spdlog::info("trained {} steps in {:.1f}s, {:.1f}k samples/s (no test split)", result.steps,
                 result.seconds, result.samples_per_second / 1e3);
  metrics.write({{"event", "end"},
                 {"steps", result.steps},
                 {"train_loss", result.train_loss},
                 {"test_accuracy", result.test.accuracy},
                 {"test_loss", result.test.loss},
                 {"train_seconds", result.seconds},
                 {"samples_per_s", result.samples_per_second}});
  if (!config_.save_weights.empty()) {
    save_mlp_weights(config_.save_weights, model_.shape(), model_.params());
    spdlog::info("weights written to {}", config_.save_weights);
  }
  return result;
}

}  // namespace ddp
