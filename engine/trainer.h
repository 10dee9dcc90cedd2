// Trainer: the training loop of one process on the CPU: sampler -> batch -> forward and
// backward -> optimizer -> metrics; evaluation on the test split.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/config.h"
#include "engine/metrics.h"
#include "engine/sampler.h"
#include "models/dataset.h"
#include "models/mlp_cpu.h"

namespace ddp {

struct StepStats {
  double loss_sum = 0;  // summed over the step's samples
  int correct = 0;
  int samples = 0;
};

struct EvalResult {
  double loss = 0;      // mean over the split
  double accuracy = 0;  // fraction in [0, 1]
  int64_t samples = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double train_loss = 0;      // mean over the last logging window
  double train_accuracy = 0;  // fraction, same window
  EvalResult test;
  double seconds = 0;  // training loop only
  double samples_per_second = 0;
};

class Trainer {
 public:
  // `data` must outlive the trainer. Checks that the model fits the data.
  Trainer(const TrainConfig& config, const Dataset& data);

  int64_t total_steps() const { return total_steps_; }
  int64_t current_step() const { return step_; }
  // One optimizer step over the next global batch.
  StepStats step();
  EvalResult evaluate(const Split& split);
  // The whole run: logs progress, writes metrics (to `metrics` when given, else to
  // config.metrics), evaluates, saves weights.
  TrainResult run(MetricsWriter* metrics = nullptr);

  const MlpShape& shape() const { return model_.shape(); }
  const float* params() const { return model_.params(); }
  float* params() { return model_.params(); }

 private:
  void gather_batch(int64_t begin, int count);

  TrainConfig config_;
  const Dataset& data_;
  CpuMlp model_;
  std::unique_ptr<Optimizer> optimizer_;
  Sampler sampler_;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;
  std::vector<int32_t> batch_indices_;
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_y_;
};

// Loads the dataset that `config` names (fashion, npy or synthetic).
Dataset load_dataset(const TrainConfig& config);

}  // namespace ddp
