// The GPU runner, for every layout: the rank's stage as a CudaStage on its compute stream
// (without a pipeline, the whole model: stage 0 of 1; with several stages a rank, a CudaStage
// each on one stream over the rank's flat buffers, handing over in device memory between two
// of them), fed its samples and optimizer scalars by a BatchFeeder. The whole step (gather,
// forwards, backwards, the transfers to the neighbouring stages, the data-parallel
// all-reduces, the optimizer) runs from device-resident data and schedule, so it is captured
// once in a CUDA graph and replayed. Activations and gradients go to the neighbouring stages
// over NCCL (each direction on its own communicator, so neither queue waits behind the other;
// with several stages a rank, each flow to each peer on a lane of its own), waited for by the
// stream, never by the host. The whole model takes the samples and scalars of a chunk of steps
// (one per logging window, at most 512) at once and the host waits for the device once per
// chunk; a pipeline stage takes one step at a time and the host waits for each (its
// micro-batches' spans are timed by events). Every host wait is bounded by --timeout when
// there are peers. Each stage's actions (forward, backward, transfers): GpuChunk, gpu_chunk.h.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <future>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "dist/ddp.h"
#include "dist/grad_sync.h"
#include "engine/runners/fused_step.h"
#include "engine/runners/gpu_chunk.h"
#include "engine/runners/gpu_step_hooks.h"
#include "engine/runners/optimizer_overlap.h"
#include "engine/runners/stage_runner.h"
#include "engine/runners/stage_transfers.h"
#include "engine/runners/step_replay.h"
#include "engine/telemetry/gpu_timeline.h"
#include "engine/telemetry/timeline.h"
#include "engine/zero/device_store.h"
#include "models/autotune_cache.h"
#include "models/batch_feeder.h"
#include "models/mlp_stage_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/step_graph.h"
#include "runtime/timer.h"

namespace ddp {

namespace {

// `tuned`: --autotune applies (the whole model: its training batch is slot 0's max_batch).
CudaStageOptions stage_options(const RunnerOptions& runner, bool tuned) {
  CudaStageOptions options;
  options.precision = runner.precision;
  options.fused_epilogues = runner.step.fused_epilogues;
  options.product_sms = runner.step.product_sms;
  options.weight_grad_stream = runner.step.weight_grad_stream;
  options.sync_debug = runner.step.sync_debug;
  options.autotune = runner.autotune && tuned;
  options.autotune_cache = autotune_cache_path(runner.cache_dir);
  options.split_backward = runner.split_backward;
  options.recompute = runner.recompute;
  return options;
}

// Whether the stage's gradients go into a ring (gradient sync's decision, from its options).
RingLayout ring_layout(const StageSpec& spec, const SyncOptions& sync, int stages_on_rank) {
  return sync_ring_layout(sync, stages_on_rank, spec.micro_batches, spec.replicas);
}

// --nccl-symmetric: NCCL's window memory for the gradients, where replicas reduce them (null:
// cudaMalloc's).
const DeviceAllocator* grads_memory(const SyncOptions& sync, const StageSpec& spec) {
  return sync.symmetric_memory && spec.replicas > 1 ? &nccl_window_memory("--nccl-symmetric")
                                                    : nullptr;
}

// The same, with the stage's gradient ring cut from the rank's buckets `plan` (where a ring
// applies the rank has this one stage, so the rank's buckets are the stage's).
CudaStageOptions stage_options(const StageSpec& spec, const RunnerOptions& runner, bool tuned,
                               int stages_on_rank, const BucketPlan& plan) {
  CudaStageOptions options = stage_options(runner, tuned);
  options.gradient_ring = device_gradient_ring(plan.buckets, spec.param_count(),
                                               ring_layout(spec, runner.sync, stages_on_rank));
  options.grads_memory = grads_memory(runner.sync, spec);
  return options;
}

// Stage `c` of the rank's `stages` on the GPU; with several stages a rank, in the rank's
// `shared` flat buffers and stream. A pipeline stage evaluates in chunks of max_batch; the
// whole model (`alone`) in training-size chunks, so that its buffers stay those of training.
std::unique_ptr<CudaStage> make_stage(const RankStages& stages, size_t c,
                                      const RunnerOptions& runner, const BucketPlan& plan,
                                      bool alone, DeviceParameters* shared,
                                      cudaStream_t shared_stream) {
  const StageSpec& chunk = stages.chunks[c];
  CudaStageOptions options =
      stage_options(chunk, runner, alone, static_cast<int>(stages.chunks.size()), plan);
  if (shared != nullptr)
    options.shared = {shared, stages.offset_of(static_cast<int>(c)), shared_stream};
  return std::make_unique<CudaStage>(chunk.shape, chunk.first, chunk.end,
                                     alone ? chunk.batch : chunk.max_batch, chunk.slots,
                                     runner.optimizer, options);
}

// The training set stays on the host where asked or where it does not fit in half the
// free device memory (then one micro-batch a step).
bool use_host_staging(const RunnerOptions& options, const Split& train, bool lead) {
  size_t free_bytes = 0, total_bytes = 0;
  DDP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t data_bytes = train.x.size() * sizeof(float) + train.y.size() * sizeof(int32_t);
  if (!options.stage_from_host && data_bytes <= free_bytes / 2) return false;
  DDP_USAGE_CHECK(options.accumulate == 1,
                  "--accumulate {}: the training set {} on the host{}, and host staging takes one "
                  "batch a step; drop --accumulate (or --stage-from-host) or use --device cpu",
                  options.accumulate, options.stage_from_host ? "stays" : "must stay",
                  options.stage_from_host ? " (--stage-from-host)"
                                          : " (it does not fit in half the free device memory)");
  if (lead)
    spdlog::info(
        "training set ({:.1f} MiB) stays on the host; batches are staged through pinned "
        "memory",
        data_bytes / 1048576.0);
  return true;
}

class GpuRunner final : public StageRunner {
 public:
  // Made before the data and the communicators are ready (the whole model's plans and
  // autotuning run while they load and start); attach() then takes them.
  GpuRunner(const RankStages& stages, const RunnerOptions& options)
      : stages_(stages),
        spec_(stages.chunks.front()),
        options_(options),
        alone_(spec_.stages == 1),
        shared_{nullptr, nullptr, options.split_backward} {
    // --init-weights are read (and checked) on another thread while the stages build.
    if (!options.init_weights.empty())
      weights_read_ = std::async(std::launch::async, [this] {
        loaded_ =
            stages_.take(initial_weights(options_.init_weights, options_.seed, spec_.shape).data());
      });
    // Several stages: one stream and one set of flat buffers for all of them.
    const bool several = stages.chunks.size() > 1;
    if (several) {
      own_stream_.emplace();
      own_weights_ = std::make_unique<DeviceParameters>(
          stages.param_count(), options.precision == Precision::kBf16, options.optimizer,
          own_stream_->get(), GradientRing{}, grads_memory(options.sync, spec_));
    }
    const SyncOptions& sync = options_.sync;
    BucketPlan plan = stage_bucket_plan(stages, sync);  // the ring's and the Reducer's
    for (size_t c = 0; c < stages.chunks.size(); ++c)
      chunks_.push_back(std::make_unique<GpuChunk>(
          shared_, stages.chunks[c],
          make_stage(stages, c, options, plan, alone_, own_weights_.get(),
                     several ? own_stream_->get() : nullptr)));
    link_neighbours(chunks_);
    CudaStage& front = chunks_.front()->stage();
    weights_ = several ? own_weights_.get() : &front.weights();
    stream_ = front.stream();
    replay_ = std::make_unique<StepReplay>(stream_, alone_);
    DeviceStoreLayout layout;
    layout.count = stages.param_count();
    layout.layers = stages.layer_spans();
    for (const StageSpec& c : stages.chunks)
      layout.stage_layers.push_back(c.end - c.first);
    layout.plan = std::move(plan);
    layout.ring = ring_layout(spec_, sync, static_cast<int>(stages.chunks.size()));
    layout.sync = sync;
    store_ = std::make_unique<DeviceParamStore>(
        std::move(layout), *weights_, stream_,
        [this](const OptStep* steps, const int* counter) { whole_update(steps, counter); });
    store_->set_wait([this] { wait_stream(); });
    // Where the state gathers a layer's parameters for each use, each stage asks it first.
    store_->set_rewire([this](ReplicaState& state) {
      if (!state.gathers_layers()) return;
      int base = 0;  // the chunk's first layer among the rank's
      for (auto& chunk : chunks_) {
        const int first = chunk->spec().first;
        const int count = chunk->spec().end - first;
        chunk->stage().set_layer_hook([&state, base, first](int layer, int next) {
          state.use_layer(base + layer - first, next < 0 ? -1 : base + next - first);
        });
        // The schedule's kUnshard and kReshard (Trainer: add_unshard_reshard).
        chunk->set_gathers(
            [&state, base, first](int layer) { state.prefetch_layer(base + layer - first); },
            [&state, base, count] { state.release_layers(base, base + count); });
        base += count;
      }
    });
    // Gathered layers move the parameters into gather slots, and the plans are made again there.
    if (options.autotune && alone_ && !sync.gathers_layers()) front.autotune();
    epilogues_ = front.epilogue_summary();  // slot 0's plans built
    feeder_ = std::make_unique<BatchFeeder>(spec_.batch, spec_.micro_batches,
                                            alone_ ? std::min(options.log_every, 512) : 1, stream_);
    store_->set_step_scalars(feeder_->steps(), feeder_->counter());
    hooks_ = std::make_unique<GpuStepHooks>(stream_, alone_, spec_.micro_batches,
                                            static_cast<int>(chunks_.size()));
    shared_.hooks = hooks_.get();  // the stages' actions use them from now on
    shared_.feeder = feeder_.get();
    model_s_ = clock_.seconds();
  }

  ~GpuRunner() override {
    if (weights_read_.valid()) weights_read_.wait();
    const cudaError_t error = cudaStreamSynchronize(stream_);
    if (error != cudaSuccess)
      spdlog::error("the runner's stream did not drain at the end: {}", cudaGetErrorString(error));
  }

  bool on_gpu() const override { return true; }
  void profile(bool on) override {
    // The steps before stay out of the range and this one's last kernels in it.
    DDP_CUDA_CHECK(cudaDeviceSynchronize());
    DDP_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
  }
  PipelineStage& chunk(int c) override {
    DDP_CHECK(c >= 0 && c < static_cast<int>(chunks_.size()), "the rank holds {} stages, not {}",
              chunks_.size(), c + 1);
    return *chunks_[c];
  }
  ReplicaStore& param_store() override { return *store_; }
  float* grads() override { return weights_->grads(); }
  void* stream() override { return stream_; }

  void attach(const Dataset& data, StageLinks links, Communicator* world,
              std::function<void()> abort_all) override {
    world_s_ = clock_.seconds();
    lead_ = world == nullptr || world->rank() == 0;
    store_->set_lead(lead_, alone_);  // the whole model's runner says its data parallelism
    if (lead_ && options_.sync.symmetric_memory && spec_.replicas == 1)
      spdlog::warn(
          "--nccl-symmetric: one replica of each stage (no data parallelism), so no gradients are "
          "reduced and no window is registered");
    if (alone_ && use_host_staging(options_, data.train, lead_)) {
      feeder_->set_train_data_host(data.train);
    } else {
      // The stages that read the data hold the training split on the device.
      feeder_->set_train_data(data.train, stages_.has_first(), stages_.has_last());
      train_rows_ = data.train.n;
    }
    if (data.test.n > 0) {
      eval_.upload(data.test, stages_.has_first(), stages_.has_last(), stream_);
      eval_split_ = &data.test;
    }
    for (Communicator* c : {links.activations, links.gradients})
      if (c != nullptr) c->set_compute_stream(stream_);
    for (const auto& [lane, c] : links.lanes)
      c->set_compute_stream(stream_);
    for (auto& chunk : chunks_)
      chunk->attach(links);
    if (!links.lanes.empty()) {  // one number end to end on each lane (check_lanes)
      DeviceBuffer<int32_t> word(1, MemoryCategory::kOther);
      check_lanes(
          links, spec_.rank, word.data(),
          [&word](int32_t value) {
            DDP_CUDA_CHECK(cudaMemcpy(word.data(), &value, sizeof(value), cudaMemcpyHostToDevice));
          },
          [&word] {
            int32_t value = 0;
            DDP_CUDA_CHECK(cudaMemcpy(&value, word.data(), sizeof(value), cudaMemcpyDeviceToHost));
            return value;
          },
          options_.timeout, lead_);
    }
    // With peers, every host wait on the stream is bounded: a dead or stopped rank makes the
    // others fail within --timeout with a message naming it, instead of hanging in a sync.
    if (world != nullptr && world->size() > 1)
      replay_->watch(options_.timeout,
                     abort_on_stall(world, std::move(abort_all), options_.timeout));
    if (alone_) {
      spdlog::info("memory at start: {}", memory_report());
      if (lead_) spdlog::info("{}", epilogues_);
    } else {
      for (const auto& c : chunks_)
        spdlog::info("stage {}: layers {}-{} on the GPU, {} activation slots{}", c->spec().stage,
                     c->spec().first, c->spec().end - 1, c->spec().slots,
                     chunks_.size() > 1
                         ? fmt::format(" (pipeline rank {}; {})", spec_.rank, c->describe_links())
                         : "");
      spdlog::info("memory: {}", memory_report());
      if (options_.autotune && spec_.stage == 0)
        spdlog::warn(
            "--autotune: tunes the whole model's products (no pipeline) only so far; the "
            "stages use cuBLASLt's first choice");
    }
  }

  // The initial weights: read from --init-weights, or made on the device (bitwise the host's
  // init_params, the stage's slice of them).
  bool initial_params() override {
    if (weights_read_.valid()) {
      weights_read_.get();
      weights_->set(loaded_.data());
      loaded_ = {};
    } else {
      for (const auto& c : chunks_)
        c->stage().init_params_on_device(options_.seed);
    }
    if (lead_ && alone_) {
      if (options_.autotune && !chunks_.front()->stage().autotune_save_error().empty())
        spdlog::warn("--autotune: the choices were not kept for the next run: {}",
                     chunks_.front()->stage().autotune_save_error());
      spdlog::info(
          "model ready in {:.2f}s (cuBLASLt plans{}), communicator by {:.2f}s, weights {} by "
          "{:.2f}s",
          model_s_,
          !options_.autotune ? ""
          : chunks_.front()->stage().autotune_cached()
              ? " and autotuning, from " + autotune_cache_path(options_.cache_dir)
              : std::string(" and autotuning"),
          world_s_, options_.init_weights.empty() ? "initialised on the GPU" : "read and uploaded",
          clock_.seconds());
    }
    return true;
  }

  std::vector<float> get_params() override {
    wait_idle();
    return store_->state().params(stages_.param_count());
  }
  void set_params(const float* host) override { store_->state().set_params(host); }
  NamedState optimizer_state() override {
    wait_idle();
    return store_->state().optimizer_state(stages_.param_count());
  }
  void set_optimizer_state(const NamedState& state, int64_t steps) override {
    store_->state().set_optimizer_state(state);
    optimizer_steps_ = steps;
  }
  int64_t optimizer_steps() const override { return optimizer_steps_; }

  int steps_ahead() const override { return feeder_->max_steps(); }
  // Not counted: its activation slots are the schedule's plan (ScheduleExecutor::slots).
  int peak_held_activations() const override { return -1; }
  int64_t peak_activation_bytes() const override { return -1; }
  void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                   int steps) override {
    if (!hooks_ready_) set_up_hooks();
    // The previous chunk must be done before the feeder's buffers are rewritten; waited for
    // under the watchdog, so that the feeder's own wait returns at once.
    wait_idle();
    // The optimizer's own count (as the CPU's): after a resume it may differ from the
    // training step (steps skipped before the checkpoint).
    opt_steps_.resize(steps);
    for (int k = 0; k < steps; ++k)
      opt_steps_[k] = optimizer_scalars(options_.optimizer, lrs[k], optimizer_steps_ + k);
    const size_t per_step = static_cast<size_t>(spec_.micro_batches) * spec_.batch;
    if (feeder_->host_staged()) chunk_indices_.assign(indices, indices + per_step * steps);
    replay_->begin_chunk(first_step, steps);
    feeder_->upload_schedule(indices, opt_steps_.data(), steps);
    // The stream is idle (the previous step was waited for): the spans' anchor.
    hooks_->chunk_begins();
  }

  void end_schedule() override {
    for (auto& chunk : chunks_)
      chunk->wait_sends();
    hooks_->end_schedule();  // after Reducer::end_backward (the executor's)
  }
  bool grads_nonfinite() override { return false; }  // the GPU stops on the loss instead
  void optimizer_step() override {
    // --zero 3: the step forgets every gather first (a prefetch nobody used is done before the
    // update writes the pieces), so none is left past the step (nor past its capture).
    store_->state().step();
    feeder_->next_step();
  }

  void run_step(int64_t step, const std::function<void()>& enqueue) override {
    const int64_t in_chunk = replay_->in_chunk(step);
    // Host state of the step, set here because a replayed step does not call `enqueue`.
    store_->state().forget_gathers();  // every layer gathered afresh in the step (none pending)
    hooks_->step_begins();
    // Host staging: this step's batch gathered on the host (and its copy started) while the
    // GPU still runs the previous one.
    if (feeder_->host_staged())
      feeder_->stage_batch(chunk_indices_.data() +
                           static_cast<size_t>(in_chunk) * spec_.micro_batches * spec_.batch);
    // The step: the schedule's actions as `enqueue` runs them, or the fused step instead.
    const std::function<void()> fused = [this] { fused_->run(); };
    const StepGraph::Ran ran = replay_->run(step, step_strategy().graph, fused_ ? fused : enqueue);
    ++optimizer_steps_;  // the step's optimizer, replayed or not
    if (ran == StepGraph::Ran::kCaptured) {
      hooks_->captured();
      if (!alone_ && spec_.stage == 0) spdlog::info("pipeline step captured in a CUDA graph");
      if (alone_ && lead_) spdlog::info("step captured in a CUDA graph; replayed from now on");
    } else if (ran == StepGraph::Ran::kReplayed) {
      hooks_->replayed();  // its events, recorded again by the replay
    }
  }
  // Decided by the first begin_steps (set_up_hooks chooses the fused step).
  StepStrategy step_strategy() const override {
    StepStrategy strategy;
    strategy.fused = fused_ != nullptr;
    strategy.graph =
        options_.step.cuda_graph && !options_.step.sync_debug && !feeder_->host_staged();
    return strategy;
  }
  void add_device_spans(TimelineRecorder& timeline, int64_t step) override {
    hooks_->add_device_spans(timeline, step, chunks_.size() > 1);
  }
  // The whole model's step is timed by the host's clock; a pipeline stage's by its events.
  double last_busy_s() const override { return hooks_->last_busy_s(); }
  bool last_costs(ComputeCosts* costs) const override { return hooks_->last_costs(costs); }
  LossSum take_loss() override {
    wait_idle();
    return chunks_.back()->stage().take_sums(false);
  }
  LossSum evaluate(const Split& split, int64_t begin, int64_t end) override {
    wait_idle();
    if (&split != eval_split_) {
      eval_.upload(split, stages_.has_first(), stages_.has_last(), stream_);
      eval_split_ = &split;
    }
    DDP_CHECK(begin >= 0 && begin <= end && end <= eval_.n, "samples [{}, {}) of {}", begin, end,
              eval_.n);
    const int chunk = chunks_.front()->stage().max_batch();
    for (int64_t at = begin; at < end; at += chunk) {
      const int n = static_cast<int>(std::min<int64_t>(chunk, end - at));
      for (const auto& c : chunks_)
        c->evaluate(
            stages_.has_first() ? eval_.x.data() + static_cast<size_t>(at) * split.dim : nullptr,
            stages_.has_last() ? eval_.y.data() + at : nullptr, n);
    }
    store_->state().match_evaluation(split.n, (end - begin + chunk - 1) / chunk, chunk);
    wait_stream();
    return chunks_.back()->stage().take_sums(true);
  }
  std::string memory_report() const override { return chunks_.front()->stage().memory_report(); }
  int64_t held_bytes() const override { return static_cast<int64_t>(memory_ledger().total()); }
  std::vector<std::pair<std::string, int64_t>> held_by_kind() const override {
    std::vector<std::pair<std::string, int64_t>> kinds;
    for (size_t i = 0; i < static_cast<size_t>(MemoryCategory::kCount); ++i)
      kinds.emplace_back(category_name(static_cast<MemoryCategory>(i)),
                         static_cast<int64_t>(memory_ledger().bytes[i].load()));
    return kinds;
  }

 private:
  // The whole state's update (the store's update_whole): one pass over the rank's buffers, or the
  // updates overlapped with the last backward joined.
  void whole_update(const OptStep* steps, const int* counter) {
    OptimizerOverlap* overlapped = hooks_->overlapped();
    if (own_weights_ && !overlapped)
      own_weights_->update(0, own_weights_->count(), steps, counter, stream_);
    else if (!overlapped)
      chunks_.front()->stage().optimizer_step(steps, counter);
    else if (store_->ddp() == nullptr)
      overlapped->join();  // the updates made during the last backward
  }
  void wait_idle() { replay_->wait_idle(); }
  void wait_stream() { replay_->wait_stream(); }
  // Once the trainer has set up data parallelism (or not): the overlapped optimizer and the
  // timeline, which need its buckets.
  void set_up_hooks() {
    hooks_ready_ = true;
    GpuStepHooks::Setting setting;
    setting.options = &options_;
    setting.spec = &spec_;
    setting.stage = &chunks_.front()->stage();
    setting.feeder = feeder_.get();
    setting.ddp = store_->ddp();
    setting.state = &store_->state();
    setting.several = chunks_.size() > 1;
    setting.lead = lead_;
    hooks_->set_up(setting);
    OptimizerOverlap* overlapped = hooks_->overlapped();
    FusedStepSetting fused;
    fused.options = &options_;
    fused.spec = &spec_;
    fused.stage = &chunks_.front()->stage();
    fused.feeder = feeder_.get();
    fused.stream = stream_;
    fused.optimizer_steps = optimizer_steps_;
    fused.train_rows = train_rows_;
    fused.lead = lead_;
    fused.whole_model = alone_;
    fused.data_parallel = store_->ddp() != nullptr;
    fused.overlapped = overlapped != nullptr;
    fused.timeline = hooks_->timeline();
    fused_ = FusedStep::choose(fused);
    if (!lead_ || !alone_) return;
    spdlog::info("optimizer {}",
                 fused_       ? std::string("in the fused step")
                 : overlapped ? fmt::format("overlapped with backward ({} ranges on a side stream)",
                                            store_->ddp() ? store_->ddp()->buckets().size()
                                                          : spec_.shape.num_layers())
                              : store_->state().describe_update(spec_.param_count()));
  }

  RankStages stages_;
  StageSpec spec_;  // the first of them
  RunnerOptions options_;
  bool alone_;             // the whole model: no neighbours, chunks of steps
  GpuChunkShared shared_;  // the stages' hooks, feeder and backward's split (GpuChunk)
  Stopwatch clock_;        // since the runner was made: its start-up figures
  double model_s_ = 0, world_s_ = 0;
  std::vector<float> loaded_;  // --init-weights (the rank's slices), read while it builds
  std::future<void> weights_read_;
  // Several stages a rank: their stream and flat buffers (before the stages, which use them).
  std::optional<CudaStream> own_stream_;
  std::unique_ptr<DeviceParameters> own_weights_;
  std::vector<std::unique_ptr<GpuChunk>> chunks_;  // the rank's stages, in stage order
  DeviceParameters* weights_ = nullptr;            // the rank's flat buffers
  cudaStream_t stream_ = nullptr;                  // and its compute stream
  std::string epilogues_;
  std::unique_ptr<BatchFeeder> feeder_;  // the training split, the steps' samples and scalars
  bool lead_ = true;
  DeviceSplit eval_;  // the split evaluated: features on the first stage, labels on the last
  const Split* eval_split_ = nullptr;
  // The rank's parameters as gradient sync keeps them: the state (whole, or sharded over the
  // replicas) that updates them, and the Reducer.
  std::unique_ptr<DeviceParamStore> store_;
  std::unique_ptr<GpuStepHooks> hooks_;  // the layer hook, the schedule's end, busy spans
  std::unique_ptr<StepReplay> replay_;   // the steps: eager, captured, replayed; the watchdog
  bool hooks_ready_ = false;
  std::vector<OptStep> opt_steps_;
  std::vector<int32_t> chunk_indices_;  // host staging: the chunk's samples
  int64_t optimizer_steps_ = 0;
  // --fused-step or --autotune, where the trial chose it: the step run instead of the
  // schedule's actions.
  std::unique_ptr<FusedStep> fused_;
  int64_t train_rows_ = 0;  // the training split's samples
};

}  // namespace

std::unique_ptr<StageRunner> make_gpu_runner(const RankStages& stages,
                                             const RunnerOptions& options) {
  return std::make_unique<GpuRunner>(stages, options);
}

}  // namespace ddp
