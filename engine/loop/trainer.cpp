// The training loop, one for every runner (CPU or GPU) and layout: steps, evaluation,
// checkpoints, metrics. Global batch t is positions [t*B, (t+1)*B) of the sampler's stream;
// with accumulation, micro-step k of step t takes the k-th B/K of it; rank r of D takes
// its contiguous share of each micro-batch.
#include "engine/loop/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "dist/agreement.h"
#include "dist/grad_sync.h"
#include "engine/loop/checkpoint.h"
#include "engine/loop/resume.h"
#include "engine/setup/run_setup.h"
#include "engine/telemetry/progress.h"
#include "models/gemm.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

Trainer::Trainer(const TrainConfig& config, const Dataset& data, Communicator* comm,
                 std::unique_ptr<StageRunner> runner)
    : config_(config),
      data_(data),
      comm_(comm),
      rank_(comm ? comm->rank() : 0),
      ranks_(comm ? comm->size() : 1),
      layout_(layout_of(config, comm ? comm->size() : 1, comm ? comm->rank() : 0)),
      micro_batches_(micro_batches_of(config)),
      local_batch_(local_batch_of(config, micro_batches_, layout_.replicas)),

      sampler_(data.train.n, config.seed, config.shuffle),
      timeline_(!config.timeline.empty()),
      options_(runner_options(config)),
      schedule_(config.pp > 1 ? config.schedule : PipelineSchedule::kOneForwardOneBackward) {
  stages_ = rank_stages(layout_, layout_.stage, stage_cut(config, layout_.replicas));
  // The whole model (pp = 1) runs a one-stage pipeline: its micro-batches are --accumulate's.
  // --zero 3's gathers start where the list says (kUnshard, kReshard).
  std::vector<PipelineAction> actions = plan_rank_schedule(schedule_, layout_.stage, layout_.stages,
                                                           layout_.chunks(), micro_batches_);
  if (options_.sync.gathers_layers()) actions = add_unshard_reshard(actions);
  executor_ = std::make_unique<ScheduleExecutor>(std::move(actions), stages_.places());
  for (StageSpec& c : stages_.chunks)
    c.slots = executor_->slots();
  spec_ = stages_.chunks.front();
  const MlpShape& shape = spec_.shape;
  check_model_fits_data(shape, config, data);
  set_cpu_threads(config.threads);
  const bool gpu = config.device == Device::kCuda;
  groups_ = make_rank_groups(comm_, layout_, gpu, options_.sync.gathers_layers());
  // A rank given other flags (another --steps, --zero or --lr) would stop early, reduce other
  // buckets or train apart: named here, on every rank, before any step.
  if (comm_ != nullptr)
    check_same_settings(*groups_.host(), flags_that_must_match(config),
                        "ddptrain: the ranks' flags differ",
                        "be started with the same flags (one command line for every rank)");
  if (layout_.stages > 1 && lead())
    spdlog::info("pipeline: dp {} x pp {}, {} micro-batches of {} per replica, {} schedule; {}",
                 layout_.replicas, layout_.stages, micro_batches_, local_batch_,
                 schedule_name(schedule_), describe_layout(layout_));
  DDP_CHECK(runner == nullptr || (gpu && layout_.stages == 1 && spec_.slots == 1),
            "a runner made beforehand is the whole model's on the GPU (whole_model_spec)");
  if (gpu) {
    runner_ = runner ? std::move(runner) : make_gpu_runner(stages_, options_);
    runner_->attach(data, groups_.links(), comm_, groups_.abort_all());
  } else {
    runner_ = make_cpu_runner(stages_, options_, data, groups_.links());
  }
  // Every stage starts from the one-process initialisation and takes its layers.
  if (!runner_->initial_params())
    runner_->set_params(
        stages_.take(initial_weights(config.init_weights, config.seed, shape).data()).data());
  total_steps_ =
      config.steps > 0
          ? config.steps
          : std::max<int64_t>(1, int64_t{config.epochs} * data.train.n / config.batch_size);
  DDP_USAGE_CHECK(config.profile_last <= total_steps_, "--profile-steps {}: the run has {} step{}",
                  config.profile_steps, total_steps_, total_steps_ == 1 ? "" : "s");
  // A data-parallel group of one (a backend named for one process) still runs the
  // data-parallel path, so that it can be checked against the plain one.
  if (layout_.replicas > 1 || (layout_.stages == 1 && comm_ != nullptr)) {
    ddp_ = GradSync::make(*dp_comm(), runner_->param_store(), options_.sync,
                          {stages_.fingerprint(), "--layers " + stages_.shape().to_string()},
                          lead(), groups_.gathers.get());
  } else if (lead()) {
    if (options_.sync.zero > 0)
      spdlog::warn("--zero {}: one replica holds everything; nothing to shard", options_.sync.zero);
    if (config.grad_reduce == GradReduce::kBf16)
      spdlog::warn("--grad-reduce bf16: one replica and no --backend, so nothing is reduced");
  }
  if (config.resume && !config.checkpoint_dir.empty()) {
    resumed_from_ = resume_runner(config, stages_, settings(), *runner_, lead());
    step_ = std::max<int64_t>(resumed_from_, 0);
  }
  batch_indices_.resize(static_cast<size_t>(runner_->steps_ahead()) * micro_batches_ *
                        local_batch_);
  lrs_.resize(runner_->steps_ahead());
}

void Trainer::plan_steps() {
  // A chunk never crosses a logging, evaluation or checkpoint boundary, so a runner that
  // waits for its device once per chunk has waited when the trainer needs its results.
  const auto to_next = [&](int every) { return every - step_ % every; };
  int64_t n =
      std::min<int64_t>({runner_->steps_ahead(), total_steps_ - step_, to_next(config_.log_every)});
  if (config_.checkpoint_every > 0) n = std::min<int64_t>(n, to_next(config_.checkpoint_every));
  if (config_.eval_every > 0) n = std::min<int64_t>(n, to_next(config_.eval_every));
  // The step after a checkpoint's confirms it (run_loop): it ends a chunk of its own.
  if (pending_.step >= 0) n = std::min<int64_t>(n, 1);
  n = std::max<int64_t>(n, 1);  // step() past total_steps() (the tests') still runs one
  const size_t per_step = static_cast<size_t>(micro_batches_) * local_batch_;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t step = step_ + k;
    // This replica's contiguous share of each micro-batch of the global batch.
    for (int mb = 0; mb < micro_batches_; ++mb) {
      const BatchSlice slice = rank_slice(step, config_.batch_size, layout_.replica,
                                          layout_.replicas, mb, micro_batches_);
      sampler_.indices(slice.begin, slice.count,
                       &batch_indices_[k * per_step + static_cast<size_t>(mb) * local_batch_]);
    }
    lrs_[k] = lr_at(step, total_steps_, config_.lr, config_.lr_schedule, config_.warmup_steps);
  }
  runner_->begin_steps(batch_indices_.data(), lrs_.data(), step_, static_cast<int>(n));
  planned_end_ = step_ + n;
}

void Trainer::run_schedule(StepStats* stats) {
  // Each replica's loss is the mean over its samples of the whole step; the all-reduce
  // averages over replicas, so the gradient is the global batch mean.
  const float scale = 1.0f / static_cast<float>(local_batch_ * micro_batches_);
  executor_->run(*runner_, ddp_.get(), timeline_, step_ + 1, scale, stats);
  // What the runner counted as it ran, or (the GPU) the slots the schedule planned.
  const int held = runner_->peak_held_activations();
  peak_live_ = std::max(peak_live_, held >= 0 ? held : executor_->slots());
}

bool Trainer::any_rank(bool mine) {
  // Replicas hold the same values and all decide alike, but with --zero 2 each checks its
  // own gradient pieces.
  if (layout_.stages == 1 && options_.sync.zero < 2) return mine;
  double flag = mine ? 1 : 0;
  sum_over_ranks(host_comm(), &flag, 1);
  return flag > 0;
}

StepStats Trainer::step() {
  if (before_step_) before_step_(step_ + 1);
  Stopwatch step_clock;
  StepStats stats;
  if (step_ >= planned_end_) plan_steps();
  if (stages_.has_last()) stats.samples = local_batch_ * micro_batches_;
  if (runner_->on_gpu()) {
    // The whole step on the device (captured once, then replayed); its loss stays there
    // until the window's end, and a non-finite one stops the run there.
    runner_->run_step(step_, [&] {
      run_schedule(&stats);
      runner_->optimizer_step();
    });
    ++step_;
    stats.busy_s = runner_->last_busy_s();
    runner_->last_costs(&stats.costs);  // the device's, by kind
    if (timeline_.on()) runner_->add_device_spans(timeline_, step_);
    stats.step_s = step_clock.seconds();
    return stats;
  }
  run_schedule(&stats);
  // After the all-reduce every replica holds the same gradient, so every rank decides alike.
  const bool nonfinite = runner_->grads_nonfinite();
  if (any_rank(nonfinite)) {
    if (config_.on_nonfinite != OnNonfinite::kSkipStep)
      throw NonFiniteError(fmt::format(
          "step {}: non-finite gradient{}{}; stopped before any checkpoint or weights were "
          "written (lower --lr, check the data, or --on-nonfinite skip-step)",
          step_ + 1, nonfinite ? fmt::format(" on rank {}", rank_) : " on another stage",
          stages_.has_last() ? fmt::format(" (loss sum {})", stats.loss_sum) : ""));
    spdlog::warn("skipping step {}: non-finite gradient (--on-nonfinite skip-step)", step_ + 1);
    ++stats.skipped;
    ++step_;
    stats.loss_sum = 0;  // its loss is not counted in the window
    stats.correct = 0;
    stats.samples = 0;
    stats.step_s = step_clock.seconds();
    return stats;
  }
  const double start = timeline_.now_us();
  runner_->optimizer_step();
  ++step_;
  timeline_.add(SpanKind::kOptimizer, step_, -1, start, timeline_.now_us());
  Communicator* replicas = dp_comm();
  if (config_.check_replicas && replicas != nullptr && replicas->size() > 1)
    check_replicas_agree(*replicas, runner_->param_store().params(), stages_.param_count(), step_,
                         layout_);
  stats.step_s = step_clock.seconds();
  return stats;
}

LossSum Trainer::evaluate_shards(const Split& split) {
  // Each replica evaluates its contiguous shard (through its pipeline); the last stages'
  // sums are combined.
  const int64_t begin = split.n * layout_.replica / layout_.replicas;
  const int64_t end = split.n * (layout_.replica + 1) / layout_.replicas;
  const LossSum shard = runner_->evaluate(split, begin, end);
  double sums[2] = {shard.loss, static_cast<double>(shard.correct)};
  sum_over_ranks(host_comm(), sums, 2);
  return {sums[0], static_cast<int>(sums[1])};
}

EvalResult Trainer::evaluate(const Split& split) {
  EvalResult result;
  if (split.n == 0) return result;
  const LossSum sum = evaluate_shards(split);
  result.samples = split.n;
  result.loss = sum.loss / static_cast<double>(split.n);
  result.accuracy = static_cast<double>(sum.correct) / static_cast<double>(split.n);
  return result;
}

void Trainer::check_finite_params(const char* before) {
  const std::vector<float> p = runner_->get_params();
  size_t bad = p.size();
  for (size_t i = 0; i < p.size() && bad == p.size(); ++i)
    if (!std::isfinite(p[i])) bad = i;
  const bool mine = bad < p.size();
  // Replicas hold the same weights; stages are asked so that every rank stops alike.
  if (!any_rank(mine)) return;
  if (mine)
    throw NonFiniteError(
        fmt::format("after step {}: non-finite weight {} at index {} on rank {}; stopped before {} "
                    "(lower --lr or check the data)",
                    step_, p[bad], stages_.model_index(bad), rank_, before));
  throw NonFiniteError(fmt::format(
      "after step {}: non-finite weight on another stage; stopped before {}", step_, before));
}

void Trainer::gather_model(std::vector<float>* params, NamedState* state) {
  gather_whole_model(*runner_, layout_, stages_, host_pipe(), lead(), params, state);
}

void Trainer::take_checkpoint() {
  check_finite_params("writing the checkpoint (the previous one is kept)");
  const auto start = std::chrono::steady_clock::now();
  pending_ = PendingCheckpoint();
  gather_model(&pending_.checkpoint.params, &pending_.checkpoint.optimizer_state);
  pending_.gather_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  pending_.step = step_;
  Checkpoint& c = pending_.checkpoint;
  c.step = step_;
  c.optimizer_steps = runner_->optimizer_steps();
  c.optimizer = config_.optimizer.kind;
  c.batch_size = config_.batch_size;
  c.settings = settings();
}

void Trainer::write_pending_checkpoint(Write how) {
  if (lead()) {
    const auto start = std::chrono::steady_clock::now();
    writer_.wait();  // the one before, if still being written; its failure stops the run here
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    writer_.write(config_.checkpoint_dir, spec_.shape, std::move(pending_.checkpoint),
                  config_.keep_checkpoints, pending_.gather_s + waited);
    if (how != Write::kBackground) writer_.wait();
  }
  pending_ = PendingCheckpoint();
  // At the end, nobody exits before the last checkpoint is complete.
  if (how == Write::kNowThenBarrier && comm_ != nullptr && ranks_ > 1) comm_->barrier();
}

TrainResult Trainer::run(MetricsWriter* metrics, GpuMonitor* monitor) {
  try {
    return run_loop(metrics, monitor);
  } catch (const NonFiniteError&) {
    throw;  // the pending checkpoint holds what led there: it is dropped
  } catch (const std::exception& e) {
    // Any other failure (a peer gone, --fail-at-step, a signal's exception): the pending
    // checkpoint's weights were checked when it was taken, so it is written, here alone
    // (the other ranks may be gone: no collective).
    if (lead()) {
      try {
        writer_.wait();  // the one in flight is finished (a failure was said as it happened)
      } catch (const std::exception&) {
      }
    }
    if (pending_.step >= 0 && lead()) {
      try {
        write_pending_checkpoint(Write::kNowAlone);
      } catch (const std::exception&) {  // the writer said why, naming the step
      }
    }
    throw;
  }
}

TrainResult Trainer::run_loop(MetricsWriter* metrics_in, GpuMonitor* monitor) {
  MetricsWriter own_metrics = metrics_in != nullptr || config_.metrics.empty() || !lead()
                                  ? MetricsWriter()
                                  : MetricsWriter(config_.metrics);
  MetricsWriter& metrics = metrics_in != nullptr ? *metrics_in : own_metrics;
  TrainResult result;
  ProgressReporter progress({config_.batch_size, config_.lr, config_.lr_schedule,
                             config_.warmup_steps, config_.quiet, config_.start_time_ms},
                            total_steps_, data_.train.n, &metrics);
  if (resumed_from_ >= 0) metrics.write({{"event", "resumed"}, {"step", resumed_from_}});
  double window[3] = {0, 0, 0};   // loss sum, hits, samples
  double busy_s = 0, step_s = 0;  // this rank's, over the window
  ComputeCosts costs;             // and its compute by kind
  int64_t window_steps = 0;
  int64_t window_skipped = 0;
  bool first = true;
  std::set<std::string> gpu_warned;  // the GPU monitor's warnings, each said once
  if (monitor != nullptr) monitor->begin_training();
  while (step_ < total_steps_) {
    if (ddp_) ddp_->record_events(first);
    if (!profiling_ && config_.profile_first > 0 && step_ + 1 >= config_.profile_first &&
        step_ + 1 <= config_.profile_last) {
      runner_->profile(true);
      profiling_ = true;
      if (lead())
        spdlog::info("--profile-steps {}: the CUDA profiler's capture range opens before step {}",
                     config_.profile_steps, step_ + 1);
    }
    const StepStats stats = step();
    if (profiling_ && step_ >= config_.profile_last) {
      runner_->profile(false);
      profiling_ = false;
      if (lead())
        spdlog::info("--profile-steps {}: the capture range closes after step {}",
                     config_.profile_steps, step_);
    }
    if (first && ddp_ && lead()) write_ddp_timeline(metrics, *ddp_, step_);
    if (first) {
      progress.first_step_done();
      // The step strategy, decided as the first step began (StageRunner::step_strategy).
      const StepStrategy strategy = runner_->step_strategy();
      metrics.write({{"event", "step_strategy"},
                     {"strategy", strategy.name()},
                     {"fused", strategy.fused},
                     {"graph", strategy.graph}});
    }
    first = false;
    if (stats.skipped > 0) {
      ++skipped_;
      ++window_skipped;
      metrics.write({{"event", "skipped_step"}, {"step", step_}, {"skipped_total", skipped_}});
    }
    window[0] += stats.loss_sum;
    window[1] += stats.correct;
    window[2] += stats.samples;
    // The checkpoint taken after the step before is written once this step, which starts
    // from its weights, has a finite loss (and, checked in step(), finite gradients).
    if (pending_.step >= 0 && stats.skipped == 0) {
      const LossSum kept = runner_->take_loss();  // the GPU's, kept on the device
      window[0] += kept.loss;
      window[1] += kept.correct;
      double loss = stats.loss_sum + kept.loss;
      sum_over_ranks(host_comm(), &loss, 1);
      if (!std::isfinite(loss))
        throw NonFiniteError(fmt::format(
            "step {}: non-finite loss; the checkpoint of step {} was not written (the one "
            "before it is kept; lower --lr or check the data)",
            step_, pending_.step));
      write_pending_checkpoint(Write::kBackground);
    }
    busy_s += stats.busy_s;
    step_s += stats.step_s;
    costs.add(stats.costs);
    ++window_steps;
    if (step_ % config_.log_every == 0 || step_ == total_steps_) {
      const LossSum kept = runner_->take_loss();  // the GPU's, kept on the device
      window[0] += kept.loss;
      window[1] += kept.correct;
      sum_over_ranks(host_comm(), window, 3);  // the same sums on every rank: all decide alike
      if (!std::isfinite(window[0]))
        throw NonFiniteError(
            fmt::format("steps up to {}: non-finite loss on rank {}; stopped before any "
                        "checkpoint or weights were written (lower --lr or check the data)",
                        step_, rank_));
      check_skipped_steps(config_, window_skipped, window_steps, step_);
      window_skipped = 0;
      const GpuWindowReport gpu = report_gpu_window(host_comm(), monitor, lead(), &gpu_warned);
      progress.window(step_, window[0], static_cast<int64_t>(window[1]),
                      static_cast<int64_t>(window[2]), &result, gpu.fields, gpu.note);
      if (layout_.stages > 1)
        write_pipeline_record(metrics, host_comm(), layout_, micro_batches_, schedule_,
                              config_.recompute, lead(), config_.quiet, step_, window_steps, busy_s,
                              step_s, costs);
      costs = ComputeCosts();
      window[0] = window[1] = window[2] = 0;
      busy_s = step_s = 0;
      window_steps = 0;
    }
    if (config_.eval_every > 0 && step_ % config_.eval_every == 0 && data_.test.n > 0) {
      const LossSum sum = evaluate_shards(data_.test);
      progress.evaluation(step_, sum.loss, sum.correct, data_.test.n);
    }
    if (!config_.checkpoint_dir.empty() && config_.checkpoint_every > 0 &&
        step_ % config_.checkpoint_every == 0)
      take_checkpoint();
  }
  result.steps = step_;
  const double seconds = progress.seconds();
  result.test = evaluate(data_.test);
  write_end_reports(metrics, host_comm(), layout_, config_, micro_batches_, peak_live_, *runner_);
  progress.finish(seconds, &result);
  if (monitor != nullptr) write_gpu_summary(metrics, host_comm(), *monitor, lead());
  if (!config_.timeline.empty())
    write_timeline(timeline_, host_comm(), layout_, runner_->on_gpu(), lead(), config_.timeline);
  if (!config_.checkpoint_dir.empty()) {
    // No step follows the last one: its weights are known good when the test split's loss,
    // their forward pass, is finite.
    if (!std::isfinite(result.test.loss))
      throw NonFiniteError(fmt::format(
          "after step {}: non-finite test loss; the final checkpoint was not written (the one "
          "before it is kept; lower --lr or check the data)",
          step_));
    if (pending_.step != step_) take_checkpoint();
    write_pending_checkpoint(Write::kNowThenBarrier);
  }
  if (!config_.save_weights.empty()) {
    check_finite_params("writing --save-weights");
    std::vector<float> params;
    NamedState state;
    gather_model(&params, &state);
    if (lead()) {
      save_mlp_weights(config_.save_weights, spec_.shape, params.data());
      spdlog::info("weights written to {}", config_.save_weights);
    }
  }
  return result;
}

}  // namespace ddp
