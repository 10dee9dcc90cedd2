// train_on_gpu(): the host walks the sampler's stream in chunks (one per logging window),
// uploads each chunk's sample indices and optimizer scalars, then replays the captured step
// once per step; it synchronises only at window boundaries to read the loss.
#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "engine/gpu_trainer.h"
#include "engine/progress.h"
#include "engine/sampler.h"
#include "models/mlp_cuda.h"
#include "models/safetensors.h"
#include "runtime/error.h"

namespace ddp {

namespace {
Precision precision_of(const std::string& name) {
  if (name == "tf32") return Precision::kTf32;
  if (name == "bf16") return Precision::kBf16;
  return Precision::kFp32;
}
}  // namespace

TrainResult train_on_gpu(const TrainConfig& config, const Dataset& data, MetricsWriter* metrics_in,
                         std::vector<float>* final_params) {
  const MlpShape shape = parse_layers(config.layers);
  DDP_USAGE_CHECK(shape.input_width() == data.train.dim,
                  "--layers {}: the first width is {} but the {} data has {} features per sample",
                  config.layers, shape.input_width(), data.name, data.train.dim);
  DDP_USAGE_CHECK(shape.num_classes() >= data.classes,
                  "--layers {}: the last width is {} but the {} data has {} classes", config.layers,
                  shape.num_classes(), data.name, data.classes);
  CudaMlpOptions options;
  options.precision = precision_of(config.precision);
  options.cuda_graph = config.cuda_graph;
  options.fused_epilogues = config.fused_epilogues;
  options.sync_debug = config.sync_debug;
  options.max_schedule_steps = std::min(config.log_every, 512);
  CudaMlp model(shape, config.batch_size, config.optimizer, options);

  std::vector<float> params(shape.param_count());
  if (config.init_weights.empty()) init_params(shape, config.seed, params.data());
  else load_mlp_weights(config.init_weights, shape, params.data());
  model.set_params(params.data());
  model.set_train_data(data.train);
  if (data.test.n > 0) model.set_test_data(data.test);
  spdlog::info("memory at start: {}", model.memory_report());
  spdlog::info("{}", model.epilogue_summary());

  MetricsWriter own_metrics =
      metrics_in != nullptr || config.metrics.empty() ? MetricsWriter() : MetricsWriter(config.metrics);
  MetricsWriter& metrics = metrics_in != nullptr ? *metrics_in : own_metrics;
  const int64_t total_steps = config.steps > 0 ? config.steps
                                               : std::max<int64_t>(1, int64_t{config.epochs} * data.train.n /
                                                                          config.batch_size);
  Sampler sampler(data.train.n, config.seed, config.shuffle);
  ProgressReporter progress(config, total_steps, data.train.n, &metrics);
  TrainResult result;
  const int chunk = options.max_schedule_steps;
  std::vector<int32_t> indices(static_cast<size_t>(chunk) * config.batch_size);
  std::vector<OptStep> steps(chunk);
  int64_t done = 0;
  int64_t window_samples = 0;
  while (done < total_steps) {
    // A chunk never crosses a logging boundary, so each window ends on a chunk.
    const int64_t to_log = config.log_every - done % config.log_every;
    const int n = static_cast<int>(std::min<int64_t>({chunk, total_steps - done, to_log}));
    sampler.indices(done * config.batch_size, static_cast<int64_t>(n) * config.batch_size, indices.data());
    for (int k = 0; k < n; ++k) {
      const int64_t step = done + k;
      OptStep& s = steps[k];
      s.lr = lr_at(step, total_steps, config.lr, config.lr_schedule, config.warmup_steps);
      s.first = step == 0;
      const double t = static_cast<double>(step + 1);
      s.step_size = static_cast<float>(s.lr / (1.0 - std::pow(static_cast<double>(config.optimizer.beta1), t)));
      s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(config.optimizer.beta2), t)));
    }
    model.upload_schedule(indices.data(), steps.data(), n);
    for (int k = 0; k < n; ++k) model.train_step();
    done += n;
    window_samples += static_cast<int64_t>(n) * config.batch_size;
    if (done % config.log_every == 0 || done == total_steps) {
      const CudaMlp::Metrics m = model.take_metrics();
      progress.window(done, m.loss_sum, m.correct, window_samples, &result);
      window_samples = 0;
    }
  }
  model.take_metrics();
  const double seconds = progress.seconds();
  result.steps = done;
  const CudaMlp::Eval eval = model.evaluate_test();
  result.test.loss = eval.loss;
  result.test.accuracy = eval.accuracy;
  result.test.samples = eval.samples;
  progress.finish(seconds, &result);
  spdlog::info("memory at end: {}", model.memory_report());
  if (metrics.enabled())
    metrics.write({{"event", "memory"}, {"report", model.memory_report()},
                   {"held_bytes", memory_ledger().total()}});
  model.get_params(params.data());
  if (!config.save_weights.empty()) {
    save_mlp_weights(config.save_weights, shape, params.data());
    spdlog::info("weights written to {}", config.save_weights);
  }
  if (final_params != nullptr) *final_params = params;
  return result;
}

}  // namespace ddp
