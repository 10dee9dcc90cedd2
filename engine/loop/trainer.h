// Trainer: the training loop, alone, as one data-parallel rank, as one pipeline stage, or
// both (dp x pp), on the CPU or the GPU through its StageRunner: sampler -> this
// replica's slice of each micro-batch -> the stage's schedule of forwards, backwards and
// activation/gradient transfers (bucket all-reduces over the stage's data-parallel group started as
// layers finish on the last micro-batch) -> optimizer -> metrics, checkpoints; evaluation on the
// test split.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "engine/config.h"
#include "engine/loop/checkpoint.h"
#include "engine/loop/resume.h"
#include "engine/loop/run_reports.h"
#include "engine/loop/sampler.h"
#include "engine/pipeline/executor.h"
#include "engine/pipeline/schedule.h"
#include "engine/runners/stage_runner.h"
#include "engine/setup/run_setup.h"
#include "engine/telemetry/gpu_monitor.h"
#include "engine/telemetry/metrics.h"
#include "engine/telemetry/timeline.h"
#include "engine/telemetry/train_result.h"
#include "models/dataset.h"

namespace ddp {

class Trainer {
 public:
  // `data` must outlive the trainer. `comm` (may be null: one process) is the world; with
  // --pp it is split into pipeline and data-parallel groups (collective). Every rank
  // constructs its Trainer with the same config. Checks that the model fits the data, that
  // the global batch divides among micro-batches and replicas, and (collective) that every
  // replica has the same model; broadcasts replica 0's parameters; resumes from the latest
  // checkpoint with --resume. `runner`: the whole model's GPU runner, made beforehand
  // (make_gpu_runner of whole_model_spec, while the data loaded and the communicator
  // started); null: the trainer makes the runner its device and layout need.
  Trainer(const TrainConfig& config, const Dataset& data, Communicator* comm = nullptr,
          std::unique_ptr<StageRunner> runner = nullptr);

  // A fault-injection point that the tests own (ddptrain's --fail-at-step and
  // --step-delay-ms, engine/setup/faults.h): called with each step's number (1-based) before
  // the step starts; it may throw, as a failing step would.
  using StepHook = std::function<void(int64_t step)>;
  void set_before_step(StepHook hook) { before_step_ = std::move(hook); }

  int64_t total_steps() const { return total_steps_; }
  int64_t current_step() const { return step_; }
  // One optimizer step over the next global batch (collective with a group).
  StepStats step();
  // Collective over the ranks (each replica evaluates its shard; every rank gets the result).
  EvalResult evaluate(const Split& split);
  // Loss sum and hits over all of `split`, each replica its contiguous shard forwarded
  // through its pipeline, summed over the ranks (collective).
  LossSum evaluate_shards(const Split& split);
  // The whole run: logs progress, writes metrics (to `metrics` when given, else to
  // config.metrics), checkpoints, evaluates, saves weights (rank 0). `monitor` (GPU runs; null:
  // none) samples this rank's GPU: each window's figures of every rank go into the window's
  // metrics, the whole run's into a gpu_summary; every rank passes one or none alike.
  TrainResult run(MetricsWriter* metrics = nullptr, GpuMonitor* monitor = nullptr);

  const MlpShape& shape() const { return spec_.shape; }
  // This rank's stage's parameters (the whole model without a pipeline), where its device
  // keeps them (host memory on the CPU); stage_params() copies them to the host.
  const float* params() const { return runner_->param_store().params(); }
  float* params() { return runner_->param_store().params(); }
  std::vector<float> stage_params() { return runner_->get_params(); }
  const Reducer* ddp() const { return ddp_.get(); }
  int64_t resumed_from() const { return resumed_from_; }
  const PipelineLayout& layout() const { return layout_; }
  // The most micro-batches whose activations this stage held at once in any step so far.
  int peak_live_activations() const { return peak_live_; }

 private:
  // The samples and learning rates of the next steps (as many as the runner takes at once, up
  // to the next logging, evaluation or checkpoint step), handed to the runner.
  void plan_steps();
  // Runs this stage's actions for one step (every micro-batch); fills stats.
  void run_schedule(StepStats* stats);
  // The whole model's parameters and optimizer state on rank 0 (empty elsewhere);
  // collective over replica 0's pipeline.
  void gather_model(std::vector<float>* params,
                    std::vector<std::pair<std::string, std::vector<float>>>* state);
  // True on every rank when any rank's `mine` is true (a sum over the world with a
  // pipeline, where stages hold different parameters).
  bool any_rank(bool mine);
  Communicator* dp_comm() { return groups_.replicas(); }
  // The world and the pipeline group for host buffers (bookkeeping): themselves on the CPU,
  // views staged through device memory when the communicators are NCCL's.
  Communicator* host_comm() { return groups_.host(); }
  Communicator* host_pipe() { return groups_.host_pipeline(); }
  TrainResult run_loop(MetricsWriter* metrics, GpuMonitor* monitor);
  // Takes the checkpoint of the current step (its weights checked finite) as pending: it is
  // written by write_pending_checkpoint once the next step's loss is finite (collective).
  void take_checkpoint();
  // How the pending checkpoint is written: on rank 0's writer thread while training goes on
  // (at most one in flight), or now, then a barrier (the end of training: nobody exits before
  // it is complete), or now and alone (a failure: the other ranks may be gone).
  enum class Write { kBackground, kNowThenBarrier, kNowAlone };
  void write_pending_checkpoint(Write how);
  // What a checkpoint records besides the model.
  RunSettings settings() const { return run_settings(config_, total_steps_, ranks_); }
  // Throws (exit 1) when a weight is NaN or Inf, naming the step; `before` says what is
  // then not done.
  void check_finite_params(const char* before);
  bool lead() const { return rank_ == 0; }

  TrainConfig config_;
  const Dataset& data_;
  Communicator* comm_;
  int rank_ = 0;
  int ranks_ = 1;
  PipelineLayout layout_;
  int micro_batches_ = 1;
  int local_batch_ = 0;  // samples per replica per micro-batch
  RankGroups groups_;    // split from the world: before the runner, which uses them
  std::unique_ptr<ScheduleExecutor> executor_;  // this stage's schedule of a step
  RankStages stages_;  // what this rank runs: its stages (several with interleaving)
  StageSpec spec_;     // its first stage (the only one on the GPU)
  std::unique_ptr<StageRunner> runner_;
  std::unique_ptr<Reducer> ddp_;
  Sampler sampler_;
  int64_t total_steps_ = 0;
  bool profiling_ = false;  // inside --profile-steps' capture range
  int64_t skipped_ = 0;     // steps skipped by --on-nonfinite skip-step
  int64_t step_ = 0;
  int64_t resumed_from_ = -1;
  int peak_live_ = 0;
  TimelineRecorder timeline_;
  // The flags as the parts read them, decided once: the runners' and gradient sync's options
  // (--zero among them), and the schedule a step runs (1F1B's one stage without --pp).
  RunnerOptions options_;
  PipelineSchedule schedule_;
  std::vector<int32_t> batch_indices_;  // this replica's samples of the planned steps
  std::vector<float> lrs_;              // and their learning rates
  int64_t planned_end_ = 0;             // steps before it are handed to the runner
  struct PendingCheckpoint {
    int64_t step = -1;      // -1: none
    Checkpoint checkpoint;  // the whole model on rank 0
    double gather_s = 0;    // what training waited for it
  };
  PendingCheckpoint pending_;
  CheckpointWriter writer_;  // rank 0's
  StepHook before_step_;
};

}  // namespace ddp
