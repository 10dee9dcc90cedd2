// Trainer: the training loop on the CPU, alone or as one data-parallel rank: sampler ->
// this rank's slice of the global batch -> forward and backward (bucket all-reduces started
// as layers finish) -> optimizer -> metrics, checkpoints; evaluation on the test split.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/ddp.h"
#include "engine/metrics.h"
#include "engine/sampler.h"
#include "models/dataset.h"
#include "models/mlp_cpu.h"

namespace ddp {

class StoreClient;

struct StepStats {
  double loss_sum = 0;  // summed over this rank's samples of the step
  int correct = 0;
  int samples = 0;
  int skipped = 0;  // 1 when --on-nonfinite skip-step skipped this step
};

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

class Trainer {
 public:
  // `data` must outlive the trainer. `comm` (may be null: one process) is the data-parallel
  // group; every rank constructs its Trainer with the same config. Checks that the model
  // fits the data, that the global batch divides among the ranks, and (collective) that
  // every rank has the same model; broadcasts rank 0's parameters; resumes from the
  // latest checkpoint with --resume.
  Trainer(const TrainConfig& config, const Dataset& data, Communicator* comm = nullptr,
          StoreClient* store = nullptr);

  int64_t total_steps() const { return total_steps_; }
  int64_t current_step() const { return step_; }
  // One optimizer step over the next global batch (collective with a group).
  StepStats step();
  EvalResult evaluate(const Split& split);
  // Loss sum and hits over samples [begin, end) of `split` (one rank's shard).
  LossSum evaluate_range(const Split& split, int64_t begin, int64_t end);
  // The whole run: logs progress, writes metrics (to `metrics` when given, else to
  // config.metrics), checkpoints, evaluates, saves weights (rank 0).
  TrainResult run(MetricsWriter* metrics = nullptr);

  const MlpShape& shape() const { return model_.shape(); }
  const float* params() const { return model_.params(); }
  float* params() { return model_.params(); }
  const Ddp* ddp() const { return ddp_.get(); }
  int64_t resumed_from() const { return resumed_from_; }

 private:
  void gather_batch(int64_t begin, int count);
  void save_checkpoint_now();
  RunSettings settings() const;  // what a checkpoint records besides the model
  // Throws (exit 1) when a weight is NaN or Inf, naming the step; `before` says what is
  // then not done.
  void check_finite_params(const char* before) const;
  bool lead() const { return rank_ == 0; }

  TrainConfig config_;
  const Dataset& data_;
  Communicator* comm_;
  int rank_ = 0;
  int ranks_ = 1;
  int local_batch_ = 0;  // samples per rank per micro-step
  CpuMlp model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Ddp> ddp_;
  Sampler sampler_;
  int64_t total_steps_ = 0;
  int64_t skipped_ = 0;  // steps skipped by --on-nonfinite skip-step
  int64_t step_ = 0;
  int64_t resumed_from_ = -1;
  std::vector<int32_t> batch_indices_;
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_y_;
};

// Checks before any training that every output this rank will write can be written:
// --save-weights and --metrics (their folder exists and takes a new file; an existing file
// is not touched), --checkpoint-dir (created if missing, and writable). Throws UsageError
// naming the flag and the path.
void check_outputs_writable(const TrainConfig& config);

// Loads the dataset that `config` names (fashion, npy or synthetic).
Dataset load_dataset(const TrainConfig& config);

// Throws UsageError naming --layers when the model's input width or class count does not
// fit the data.
void check_model_fits_data(const MlpShape& shape, const TrainConfig& config, const Dataset& data);

// Sums a few doubles over the group (host memory; with a device communicator the values
// go through a device buffer). Collective.
void sum_over_ranks(Communicator* comm, double* values, size_t count);

}  // namespace ddp
