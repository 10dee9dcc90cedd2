// Trainer on the CPU. Global batch t is positions [t*B, (t+1)*B) of the sampler's stream;
// with accumulation, micro-step k of step t takes the k-th B/K of it; rank r of D takes
// its contiguous share of each micro-batch.
#include "engine/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "engine/checkpoint.h"
#include "engine/progress.h"
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

void check_model_fits_data(const MlpShape& shape, const TrainConfig& config, const Dataset& data) {
  DDP_USAGE_CHECK(shape.input_width() == data.train.dim,
                  "--layers {}: the first width is {} but the {} data has {} features per sample",
                  config.layers, shape.input_width(), data.name, data.train.dim);
  // A label past the model's classes is named where it is, not only as a class count.
  for (const Split* split : {&data.train, &data.test})
    for (int64_t i = 0; i < split->n && !split->labels_file.empty(); ++i)
      DDP_USAGE_CHECK(split->y[i] < shape.num_classes(),
                      "{}: label {} at index {} is out of range for --layers {} (its last width "
                      "{} means labels 0 to {})",
                      split->labels_file, split->y[i], i, config.layers, shape.num_classes(),
                      shape.num_classes() - 1);
  DDP_USAGE_CHECK(shape.num_classes() >= data.classes,
                  "--layers {}: the last width is {} but the {} data has {} classes", config.layers,
                  shape.num_classes(), data.name, data.classes);
}

void sum_over_ranks(Communicator* comm, double* values, size_t count) {
  if (comm == nullptr || comm->size() == 1) return;
  DDP_CHECK(!comm->device_buffers(), "sum_over_ranks on the CPU path needs a host communicator");
  comm->all_reduce(values, count, DataType::kFloat64, ReduceOp::kSum);
}

namespace {
int local_batch_of(const TrainConfig& config, int ranks) {
  const int micro = config.batch_size / config.accumulate;
  DDP_USAGE_CHECK(config.batch_size % config.accumulate == 0,
                  "--batch-size {} is not divisible by --accumulate {}", config.batch_size,
                  config.accumulate);
  DDP_USAGE_CHECK(
      micro % ranks == 0,
      "--batch-size {}: the global batch{} must divide among the {} data-parallel ranks (try {})",
      config.batch_size,
      config.accumulate > 1 ? fmt::format(" / --accumulate {}", config.accumulate) : "", ranks,
      (micro / ranks + 1) * ranks * config.accumulate);
  return micro / ranks;
}
}  // namespace

Trainer::Trainer(const TrainConfig& config, const Dataset& data, Communicator* comm,
                 StoreClient* store)
    : config_(config),
      data_(data),
      comm_(comm),
      rank_(comm ? comm->rank() : 0),
      ranks_(comm ? comm->size() : 1),
      local_batch_(local_batch_of(config, comm ? comm->size() : 1)),
      model_(parse_layers(config.layers),
             std::max(local_batch_, std::min(config.batch_size, 1024))),
      sampler_(data.train.n, config.seed, config.shuffle) {
  (void)store;
  const MlpShape& shape = model_.shape();
  check_model_fits_data(shape, config, data);
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
  if (comm_ != nullptr) {
    ddp_ = std::make_unique<Ddp>(*comm_, shape, static_cast<size_t>(config.bucket_mb * 1048576),
                                 static_cast<size_t>(config.first_bucket_mb * 1048576),
                                 config.overlap);
    ddp_->check_same_model(shape);
    ddp_->broadcast_parameters(model_.params(), shape.param_count());
  }
  if (config.resume && !config.checkpoint_dir.empty()) {
    const std::string path = checkpoint_path(config.checkpoint_dir);
    if (std::ifstream(path).good()) {
      const Checkpoint c = load_checkpoint(
          path, shape, config.optimizer.kind == OptimizerKind::kAdamW ? "adamw" : "sgd",
          config.batch_size, settings());
      if (lead() && !c.changed.empty())
        spdlog::warn("resuming with changed settings (allowed): {}",
                     fmt::format("{}", fmt::join(c.changed, "; ")));
      std::copy(c.params.begin(), c.params.end(), model_.params());
      for (auto& [name, buffer] : optimizer_->state())
        for (const auto& [saved_name, values] : c.optimizer_state)
          if (saved_name == name) *buffer = values;
      optimizer_->set_steps(c.optimizer_steps);
      step_ = c.step;
      resumed_from_ = c.step;
      if (lead()) spdlog::info("resumed from {} at step {}", path, c.step);
    } else if (lead()) {
      spdlog::info("no checkpoint at {}: starting afresh", path);
    }
  }
  batch_indices_.resize(local_batch_);
  batch_x_.resize(static_cast<size_t>(local_batch_) * data.train.dim);
  batch_y_.resize(local_batch_);
}

RunSettings Trainer::settings() const {
  return {config_.seed, config_.lr, total_steps_, schedule_name(config_.lr_schedule), ranks_};
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
  DDP_CHECK(
      config_.fail_at_step == 0 || config_.restart_count > 0 || step_ + 1 != config_.fail_at_step,
      "--fail-at-step {}: failing on purpose at step {}", config_.fail_at_step, step_ + 1);
  StepStats stats;
  const int micro_batch = config_.batch_size / config_.accumulate;
  // Each rank's loss is the mean over its samples of the whole step; the all-reduce
  // averages over ranks, so the gradient is the global batch mean.
  const float scale = 1.0f / static_cast<float>(local_batch_ * config_.accumulate);
  for (int k = 0; k < config_.accumulate; ++k) {
    const int64_t micro_begin = step_ * config_.batch_size + static_cast<int64_t>(k) * micro_batch;
    const int64_t begin = micro_begin + static_cast<int64_t>(rank_) * local_batch_;
    gather_batch(begin, local_batch_);
    model_.forward(batch_x_.data(), local_batch_);
    const bool last_micro = k + 1 == config_.accumulate;
    if (ddp_ && last_micro) ddp_->begin_backward(model_.grads());
    const LossSum sum =
        model_.backward(batch_y_.data(), local_batch_, scale, /*accumulate=*/k > 0,
                        ddp_ && last_micro ? [this](int layer) { ddp_->layer_done(layer); }
                                           : std::function<void(int)>());
    if (ddp_ && last_micro) ddp_->end_backward();
    stats.loss_sum += sum.loss;
    stats.correct += sum.correct;
    stats.samples += local_batch_;
  }
  if (ddp_) ddp_->finish(nullptr);
  // After the all-reduce every rank holds the same gradient, so every rank decides alike.
  // A float is Inf or NaN when its exponent bits are all set: an OR over the buffer that
  // vectorises (no sum to overflow on large finite gradients, no serial float chain).
  const float* grads = model_.grads();
  uint32_t nonfinite = 0;
  for (size_t i = 0, n = model_.shape().param_count(); i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, grads + i, sizeof(bits));
    nonfinite |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  if (nonfinite != 0) {
    DDP_CHECK(config_.on_nonfinite == "skip-step",
              "step {}: non-finite gradient on rank {} (loss sum {}); stopped before any "
              "checkpoint or weights were written (lower --lr, check the data, or "
              "--on-nonfinite skip-step)",
              step_ + 1, rank_, stats.loss_sum);
    spdlog::warn("skipping step {}: non-finite gradient (--on-nonfinite skip-step)", step_ + 1);
    ++stats.skipped;
    ++step_;
    stats.loss_sum = 0;  // its loss is not counted in the window
    stats.correct = 0;
    stats.samples = 0;
    return stats;
  }
  const float lr =
      lr_at(step_, total_steps_, config_.lr, config_.lr_schedule, config_.warmup_steps);
  optimizer_->step(model_.params(), model_.grads(), model_.shape().param_count(), lr);
  ++step_;
  if (config_.check_replicas && comm_ != nullptr && ranks_ > 1) {
    const int64_t mine = params_checksum(model_.params(), model_.shape().param_count());
    std::vector<int64_t> all(ranks_);
    comm_->all_gather(&mine, all.data(), 1, DataType::kInt64);
    for (int r = 0; r < ranks_; ++r)
      DDP_CHECK(all[r] == all[0],
                "--check-replicas: after step {} rank {} holds different weights than rank 0 "
                "(checksums {:08x} and {:08x})",
                step_, r, static_cast<uint32_t>(all[r]), static_cast<uint32_t>(all[0]));
  }
  return stats;
}

LossSum Trainer::evaluate_range(const Split& split, int64_t begin, int64_t end) {
  LossSum total{};
  const int classes = model_.shape().num_classes();
  const int chunk = model_.max_batch();
  for (int64_t at = begin; at < end; at += chunk) {
    const int count = static_cast<int>(std::min<int64_t>(chunk, end - at));
    const float* logits = model_.forward(&split.x[static_cast<size_t>(at) * split.dim], count);
    const LossSum sum = softmax_xent_cpu(logits, &split.y[at], count, classes, 0.0f, nullptr);
    total.loss += sum.loss;
    total.correct += sum.correct;
  }
  return total;
}

EvalResult Trainer::evaluate(const Split& split) {
  EvalResult result;
  if (split.n == 0) return result;
  const LossSum sum = evaluate_range(split, 0, split.n);
  result.samples = split.n;
  result.loss = sum.loss / static_cast<double>(split.n);
  result.accuracy = static_cast<double>(sum.correct) / static_cast<double>(split.n);
  return result;
}

namespace {

// Creates and removes a scratch file in `dir`; false when that fails.
bool folder_takes_files(const std::string& dir) {
  std::string pattern = (dir.empty() ? std::string(".") : dir) + "/.ddp-write-test-XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(pattern.c_str());
  return true;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void check_outputs_writable(const TrainConfig& config) {
  for (const auto& [flag, path] :
       {std::pair<const char*, std::string>{"--save-weights", config.save_weights},
        {"--metrics", config.metrics}}) {
    if (path.empty()) continue;
    struct stat info {};
    DDP_USAGE_CHECK(::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode),
                    "{} {}: is a folder; expected a file path", flag, path);
    DDP_USAGE_CHECK(folder_takes_files(folder_of(path)),
                    "{} {}: cannot create files in {} ({}); checked before training", flag, path,
                    folder_of(path), std::strerror(errno));
  }
  if (!config.checkpoint_dir.empty()) {
    ::mkdir(config.checkpoint_dir.c_str(), 0755);
    DDP_USAGE_CHECK(folder_takes_files(config.checkpoint_dir),
                    "--checkpoint-dir {}: cannot create files there ({}); checked before training",
                    config.checkpoint_dir, std::strerror(errno));
  }
}

void Trainer::check_finite_params(const char* before) const {
  // Every rank holds the same weights, so every rank decides alike.
  const float* p = model_.params();
  for (size_t i = 0, n = model_.shape().param_count(); i < n; ++i)
    DDP_CHECK(std::isfinite(p[i]),
              "after step {}: non-finite weight {} at index {} on rank {}; stopped before {} "
              "(lower --lr or check the data)",
              step_, p[i], i, rank_, before);
}

void Trainer::save_checkpoint_now() {
  check_finite_params("writing the checkpoint (the previous one is kept)");
  if (lead()) {
    Checkpoint c;
    c.step = step_;
    c.optimizer_steps = optimizer_->steps();
    c.optimizer = config_.optimizer.kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
    c.batch_size = config_.batch_size;
    c.settings = settings();
    c.params.assign(model_.params(), model_.params() + model_.shape().param_count());
    for (auto& [name, buffer] : optimizer_->state())
      c.optimizer_state.emplace_back(name, *buffer);
    save_checkpoint(config_.checkpoint_dir, model_.shape(), c, config_.keep_checkpoints);
    spdlog::info("checkpoint at step {} written to {}", step_,
                 checkpoint_path(config_.checkpoint_dir));
  }
  // Nobody moves on (and may crash and restart) before the checkpoint is complete.
  if (comm_ != nullptr && ranks_ > 1) comm_->barrier();
}

TrainResult Trainer::run(MetricsWriter* metrics_in) {
  MetricsWriter own_metrics = metrics_in != nullptr || config_.metrics.empty() || !lead()
                                  ? MetricsWriter()
                                  : MetricsWriter(config_.metrics);
  MetricsWriter& metrics = metrics_in != nullptr ? *metrics_in : own_metrics;
  TrainResult result;
  ProgressReporter progress(config_, total_steps_, data_.train.n, &metrics);
  if (resumed_from_ >= 0) metrics.write({{"event", "resumed"}, {"step", resumed_from_}});
  double window[3] = {0, 0, 0};  // loss sum, hits, samples
  bool first = true;
  while (step_ < total_steps_) {
    if (first && ddp_) ddp_->clear_events();
    const StepStats stats = step();
    if (first && ddp_ && lead() && metrics.enabled()) {
      nlohmann::json events = nlohmann::json::array();
      for (const DdpEvent& e : ddp_->events())
        events.push_back({{"what", e.what}, {"layer", e.layer}, {"bucket", e.bucket}});
      metrics.write({{"event", "ddp_timeline"},
                     {"step", step_},
                     {"buckets", ddp_->buckets().size()},
                     {"events", events}});
    }
    if (first) progress.first_step_done();
    first = false;
    if (stats.skipped > 0) {
      ++skipped_;
      metrics.write({{"event", "skipped_step"}, {"step", step_}, {"skipped_total", skipped_}});
    }
    window[0] += stats.loss_sum;
    window[1] += stats.correct;
    window[2] += stats.samples;
    if (step_ % config_.log_every == 0 || step_ == total_steps_) {
      sum_over_ranks(comm_, window, 3);  // the same sums on every rank: all decide alike
      DDP_CHECK(std::isfinite(window[0]),
                "steps up to {}: non-finite loss on rank {}; stopped before any checkpoint or "
                "weights were written (lower --lr or check the data)",
                step_, rank_);
      progress.window(step_, window[0], static_cast<int64_t>(window[1]),
                      static_cast<int64_t>(window[2]), &result);
      window[0] = window[1] = window[2] = 0;
    }
    if (config_.eval_every > 0 && step_ % config_.eval_every == 0 && data_.test.n > 0) {
      // Each rank evaluates its contiguous shard of the test split; the sums are combined.
      const int64_t begin = data_.test.n * rank_ / ranks_;
      const int64_t end = data_.test.n * (rank_ + 1) / ranks_;
      const LossSum shard = evaluate_range(data_.test, begin, end);
      double sums[3] = {shard.loss, static_cast<double>(shard.correct),
                        static_cast<double>(end - begin)};
      sum_over_ranks(comm_, sums, 3);
      progress.evaluation(step_, sums[0], static_cast<int64_t>(sums[1]),
                          static_cast<int64_t>(sums[2]));
    }
    if (!config_.checkpoint_dir.empty() && config_.checkpoint_every > 0 &&
        step_ % config_.checkpoint_every == 0)
      save_checkpoint_now();
  }
  result.steps = step_;
  const double seconds = progress.seconds();
  result.test = evaluate(data_.test);
  progress.finish(seconds, &result);
  if (!config_.checkpoint_dir.empty() &&
      (config_.checkpoint_every == 0 || step_ % config_.checkpoint_every != 0))
    save_checkpoint_now();
  if (!config_.save_weights.empty()) check_finite_params("writing --save-weights");
  if (!config_.save_weights.empty() && lead()) {
    save_mlp_weights(config_.save_weights, model_.shape(), model_.params());
    spdlog::info("weights written to {}", config_.save_weights);
  }
  return result;
}

}  // namespace ddp
