// Trainer on the CPU. Batch t of the run is positions [t*B, (t+1)*B) of the sampler's stream.
#include "engine/trainer.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "models/gemm.h"
#include "engine/progress.h"
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

TrainResult Trainer::run(MetricsWriter* metrics_in) {
  MetricsWriter own_metrics =
      metrics_in != nullptr || config_.metrics.empty() ? MetricsWriter() : MetricsWriter(config_.metrics);
  MetricsWriter& metrics = metrics_in != nullptr ? *metrics_in : own_metrics;
  TrainResult result;
  ProgressReporter progress(config_, total_steps_, data_.train.n, &metrics);
  double window_loss = 0;
  int64_t window_correct = 0;
  int64_t window_samples = 0;
  while (step_ < total_steps_) {
    const StepStats stats = step();
    window_loss += stats.loss_sum;
    window_correct += stats.correct;
    window_samples += stats.samples;
    if (step_ % config_.log_every == 0 || step_ == total_steps_) {
      progress.window(step_, window_loss, window_correct, window_samples, &result);
      window_loss = 0;
      window_correct = 0;
      window_samples = 0;
    }
  }
  result.steps = step_;
  const double seconds = progress.seconds();
  result.test = evaluate(data_.test);
  progress.finish(seconds, &result);
  if (!config_.save_weights.empty()) {
    save_mlp_weights(config_.save_weights, model_.shape(), model_.params());
    spdlog::info("weights written to {}", config_.save_weights);
  }
  return result;
}

}  // namespace ddp
