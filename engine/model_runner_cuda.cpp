// The whole model's GPU runner (no pipeline): the model as one CudaStage (stage 0 of 1, one
// slot) fed by a BatchFeeder, on the stage's compute stream. The trainer
// hands it the samples and optimizer scalars of a chunk of steps (one per logging window, at
// most 512) at once; it uploads them, and each step then runs from device-resident data and
// schedule: replayed from the captured graph; with data parallelism, bucket all-reduces are
// enqueued on NCCL's stream as backward finishes each bucket and the optimizer waits for
// them on the device. The host waits for the device once per chunk (bounded by --timeout).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <memory>

#include <spdlog/spdlog.h>

#include "engine/ddp.h"
#include "engine/ddp_device.h"
#include "engine/gpu_timeline.h"
#include "engine/optimizer_overlap.h"
#include "engine/stage_runner.h"
#include "engine/step_watchdog.h"
#include "engine/trainer.h"
#include "models/autotune_cache.h"
#include "models/batch_feeder.h"
#include "models/mlp_stage_cuda.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/step_graph.h"
#include "runtime/timer.h"

namespace ddp {

namespace {

CudaStageOptions model_options(const TrainConfig& config) {
  CudaStageOptions options;
  options.precision = config.precision;
  options.fused_epilogues = config.fused_epilogues;
  options.sync_debug = config.sync_debug;
  options.autotune = config.autotune;
  options.autotune_cache = autotune_cache_path(config.cache_dir);
  return options;
}

class GpuModelRunner final : public StageRunner, public ChunkOps {
 public:
  GpuModelRunner(const TrainConfig& config, int replicas)
      : config_(config), shape_(parse_layers(config.layers)) {
    // Each rank's micro-batch: its share of each of the step's --accumulate micro-batches.
    const int micro_batch = local_batch_of(config, config.accumulate, replicas);
    // --init-weights are read on another thread while the model builds its plans (and
    // autotunes) on the GPU.
    if (!config.init_weights.empty())
      weights_ = std::async(std::launch::async, [this] {
        loaded_.resize(shape_.param_count());
        load_mlp_weights(config_.init_weights, shape_, loaded_.data());
      });
    model_batch_ = micro_batch;
    model_ = std::make_unique<CudaStage>(shape_, 0, shape_.num_layers(), micro_batch, 1,
                                         config.optimizer, model_options(config));
    if (config.autotune) model_->autotune();
    epilogues_ = model_->epilogue_summary();  // the plans of the training batch built
    feeder_ = std::make_unique<BatchFeeder>(micro_batch, config.accumulate,
                                            std::min(config.log_every, 512), model_->stream());
    model_s_ = clock_.seconds();
  }
  ~GpuModelRunner() override {
    if (weights_.valid()) weights_.wait();
  }

  bool on_gpu() const override { return true; }
  ChunkOps& chunk(int c) override {
    DDP_CHECK(c == 0, "the GPU runner holds one stage, not chunk {}", c);
    return *this;
  }
  float* params() override { return model_->params(); }
  float* grads() override { return model_->grads(); }
  void params_changed() override { model_->refresh_low_precision_params(); }
  void* stream() override { return model_->stream(); }

  void attach(const Dataset& data, Communicator* world, std::function<void()> abort_all) override {
    world_s_ = clock_.seconds();
    lead_ = world == nullptr || world->rank() == 0;
    size_t free_bytes = 0, total_bytes = 0;
    DDP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t data_bytes =
        data.train.x.size() * sizeof(float) + data.train.y.size() * sizeof(int32_t);
    if (config_.stage_from_host || data_bytes > free_bytes / 2) {
      DDP_USAGE_CHECK(
          config_.accumulate == 1,
          "--accumulate {}: the training set {} on the host{}, and host staging takes one "
          "batch a step; drop --accumulate (or --stage-from-host) or use --device cpu",
          config_.accumulate, config_.stage_from_host ? "stays" : "must stay",
          config_.stage_from_host ? " (--stage-from-host)"
                                  : " (it does not fit in half the free device memory)");
      feeder_->set_train_data_host(data.train);
      if (lead_)
        spdlog::info(
            "training set ({:.1f} MiB) stays on the host; batches are staged through pinned "
            "memory",
            data_bytes / 1048576.0);
    } else {
      feeder_->set_train_data(data.train, true, true);
    }
    if (data.test.n > 0) test_.upload(data.test, true, true, model_->stream());
    test_split_ = &data.test;
    // With peers, every host wait on the stream is bounded: a dead or stopped rank makes the
    // others fail within --timeout with a message naming it, instead of hanging in a sync.
    if (world != nullptr && world->size() > 1)
      watchdog_ = std::make_unique<StepWatchdog>(
          model_->stream(), config_.timeout,
          abort_on_stall(world, std::move(abort_all), config_.timeout));
    spdlog::info("memory at start: {}", model_->memory_report());
    if (lead_) spdlog::info("{}", epilogues_);
  }

  bool initial_params() override {
    if (weights_.valid()) {
      weights_.get();
      model_->set_params(loaded_.data());
      loaded_ = {};
    } else {
      model_->init_params_on_device(config_.seed);  // the host's values, bitwise
    }
    if (lead_) {
      if (config_.autotune && !model_->autotune_save_error().empty())
        spdlog::warn("--autotune: the choices were not kept for the next run: {}",
                     model_->autotune_save_error());
      spdlog::info(
          "model ready in {:.2f}s (cuBLASLt plans{}), communicator by {:.2f}s, weights {} by "
          "{:.2f}s",
          model_s_,
          !config_.autotune ? ""
          : model_->autotune_cached()
              ? " and autotuning, from " + model_options(config_).autotune_cache
              : std::string(" and autotuning"),
          world_s_, config_.init_weights.empty() ? "initialised on the GPU" : "read and uploaded",
          clock_.seconds());
    }
    return true;
  }

  void prepare_ddp(Ddp& ddp, uint64_t fingerprint, const std::string& description) override {
    ddp_ = &ddp;
    bf16_grads_ =
        prepare_device_ddp(ddp, model_->stream(), fingerprint, description,
                           config_.grad_reduce == GradReduce::kBf16, shape_.param_count());
    if (lead_)
      spdlog::info(
          "data parallel over {} GPUs ({}): {} buckets, overlap {}, gradients reduced in {}",
          ddp.comm().size(), ddp.comm().backend(), ddp.buckets().size(),
          config_.overlap ? "on" : "off", grad_reduce_name(config_.grad_reduce));
  }

  std::vector<float> get_params() override {
    wait_idle();
    std::vector<float> host(shape_.param_count());
    model_->get_params(host.data());
    return host;
  }
  void set_params(const float* host) override { model_->set_params(host); }
  NamedState optimizer_state() override {
    wait_idle();
    return model_->get_optimizer_state();
  }
  void set_optimizer_state(const NamedState& state, int64_t steps) override {
    model_->set_optimizer_state(state);
    optimizer_steps_ = steps;
  }
  int64_t optimizer_steps() const override { return optimizer_steps_; }

  int steps_ahead() const override { return feeder_->max_steps(); }
  void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                   int steps) override {
    if (!hooks_ready_) set_up_hooks();
    // The previous chunk must be done before its schedule is overwritten; waited for under
    // the watchdog, so that upload_schedule's own wait returns at once.
    wait_idle();
    opt_steps_.resize(steps);
    for (int k = 0; k < steps; ++k)
      opt_steps_[k] = optimizer_scalars(config_.optimizer, lrs[k], optimizer_steps_ + k);
    const size_t per_step = static_cast<size_t>(config_.accumulate) * batch();
    if (feeder_->host_staged()) chunk_indices_.assign(indices, indices + per_step * steps);
    chunk_first_ = first_step;
    chunk_end_ = first_step + steps;
    feeder_->upload_schedule(indices, opt_steps_.data(), steps);
  }

  // One stage: nothing to send or receive.
  void recv_activation(int, int) override { no_neighbours(); }
  void send_activation(int, int) override { no_neighbours(); }
  void recv_gradient(int, int) override { no_neighbours(); }
  void send_gradient(int, int) override { no_neighbours(); }
  void forward(int micro, int slot) override {
    DDP_CHECK(slot == 0, "the whole model's runner holds one micro-batch, not slot {}", slot);
    feeder_->feed(*model_, micro, slot);
    model_->forward(slot, batch());
  }
  LossSum loss(int micro, int slot, float grad_scale) override {
    (void)micro;
    model_->loss(slot, batch(), grad_scale);
    if (timeline_) timeline_->forward_done();
    return {};  // kept on the device until take_loss()
  }
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override {
    // The layer hooks (bucket all-reduces, the timeline, the overlapped optimizer) run on the
    // step's last micro-batch, as its layers finish.
    const bool last = micro + 1 == config_.accumulate;
    if (!last || !(on_layer_done || timeline_ || overlapped_)) {
      model_->backward(slot, batch(), accumulate);
      return;
    }
    model_->backward(slot, batch(), accumulate, [&](int layer) {
      if (on_layer_done) on_layer_done(layer);
      mark_buckets();
      if (timeline_) timeline_->layer_done(layer);
      if (overlapped_) overlapped_->layer_done(layer);
    });
  }
  void end_schedule() override {
    // After Ddp::end_backward (the trainer's): the rest of the buckets are issued.
    mark_buckets();
    if (timeline_ && ddp_) timeline_->buckets_issued(*ddp_);
    // The updates joined into the model's stream; Ddp::finish then has nothing left to wait.
    if (overlapped_) overlapped_->end_backward();
  }
  bool grads_nonfinite() override { return false; }  // the GPU stops on the loss instead
  void optimizer_step() override {
    // With the optimizer overlapped, every range was updated in the hooks (and joined).
    if (!overlapped_) model_->optimizer_step(feeder_->steps(), feeder_->counter());
    feeder_->next_step();
  }

  void run_step(int64_t step, const std::function<void()>& enqueue) override {
    DDP_CHECK(step >= chunk_first_ && step < chunk_end_, "step {} is outside the chunk [{}, {})",
              step, chunk_first_, chunk_end_);
    if (overlapped_) overlapped_->begin_step();
    if (timeline_) timeline_->step_begins();
    marked_ = 0;
    // Host staging: this step's batch gathered on the host (and its copy started) while the
    // GPU still runs the previous one.
    if (feeder_->host_staged())
      feeder_->stage_batch(chunk_indices_.data() +
                           static_cast<size_t>(step - chunk_first_) * config_.accumulate * batch());
    graph_.run(model_->stream(),
               config_.cuda_graph && !config_.sync_debug && !feeder_->host_staged(), enqueue);
    ++optimizer_steps_;
    if (watchdog_) {
      watchdog_->mark(step);
      watchdog_->check();
    }
    if (steps_run_++ == 0) {  // the first step is waited for: its time is reported
      wait_idle();
      DDP_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
    } else if (step + 1 == chunk_end_) {
      wait_idle();  // before any synchronising call at the chunk's end
    }
  }
  void add_device_spans(TimelineRecorder& timeline, int64_t step) override {
    if (timeline_) timeline_->step_ends(timeline, step);
  }
  LossSum take_loss() override {
    wait_idle();
    return model_->take_sums(false);
  }
  LossSum evaluate(const Split& split, int64_t begin, int64_t end) override {
    wait_idle();
    if (&split != test_split_) {  // the test split is on the device already
      test_.upload(split, true, true, model_->stream());
      test_split_ = &split;
    }
    DDP_CHECK(begin >= 0 && begin <= end && end <= test_.n, "test samples [{}, {}) of {}", begin,
              end, test_.n);
    for (int64_t at = begin; at < end; at += batch()) {
      const int n = static_cast<int>(std::min<int64_t>(batch(), end - at));
      model_->set_input(test_.x.data() + at * split.dim, n, 0);
      model_->forward(0, n);
      model_->loss(0, n, 0.0f, test_.y.data() + at, /*evaluation=*/true);
    }
    return model_->take_sums(true);
  }
  std::string memory_report() const override { return model_->memory_report(); }
  int64_t held_bytes() const override { return static_cast<int64_t>(memory_ledger().total()); }

 private:
  int batch() const { return model_batch_; }
  static void no_neighbours() {
    DDP_CHECK(false, "the whole model's runner has no pipeline neighbours");
  }
  void wait_idle() {
    if (watchdog_) watchdog_->wait_idle();
  }
  // The data-parallel buckets issued since the last call, timed on the GPU timeline.
  void mark_buckets() {
    if (ddp_ == nullptr) return;
    for (; marked_ < ddp_->issued(); ++marked_)
      if (timeline_) timeline_->bucket_issued(marked_);
  }
  // Once the trainer has set up data parallelism (or not): the overlapped optimizer and the
  // timeline, which need its buckets.
  void set_up_hooks() {
    hooks_ready_ = true;
    // The optimizer overlapped with backward (--overlap-optimizer; else one pass after it).
    if (config_.overlap_optimizer && !(ddp_ && !config_.overlap)) {
      CudaStage* model = model_.get();
      const BatchFeeder* feeder = feeder_.get();
      overlapped_ = std::make_unique<OptimizerOverlap>(
          model->stream(),
          [model, feeder](size_t offset, size_t count, cudaStream_t stream) {
            model->optimizer_range(offset, count, feeder->steps(), feeder->counter(), stream);
          },
          ddp_ ? OptimizerOverlap::of_buckets(ddp_->buckets())
               : OptimizerOverlap::of_layers(param_spans(shape_)),
          ddp_);
    }
    if (!config_.timeline.empty()) {
      timeline_ = std::make_unique<GpuTimeline>(model_->stream(), shape_.num_layers(),
                                                ddp_ ? ddp_->buckets().size() : 0);
    }
    if (!lead_) return;
    spdlog::info("optimizer {}",
                 overlapped_ ? fmt::format("overlapped with backward ({} ranges on a side stream)",
                                           ddp_ ? ddp_->buckets().size() : shape_.num_layers())
                             : std::string("after backward"));
    if (!ddp_ && config_.grad_reduce == GradReduce::kBf16)
      spdlog::warn("--grad-reduce bf16: one process and no --backend, so nothing is reduced");
  }

  TrainConfig config_;
  MlpShape shape_;
  Stopwatch clock_;  // since the runner was made: its start-up figures
  double model_s_ = 0, world_s_ = 0;
  std::vector<float> loaded_;  // --init-weights, read while the model builds
  std::future<void> weights_;
  std::unique_ptr<CudaStage> model_;  // the whole model, one slot
  std::unique_ptr<BatchFeeder> feeder_;
  DeviceSplit test_;  // the split evaluated, on the device
  std::string epilogues_;
  int model_batch_ = 0;
  bool lead_ = true;
  const Split* test_split_ = nullptr;  // the split on the device for evaluation
  Ddp* ddp_ = nullptr;
  DeviceBuffer<uint16_t> bf16_grads_;  // the gradients on the wire with --grad-reduce bf16
  std::unique_ptr<OptimizerOverlap> overlapped_;
  std::unique_ptr<GpuTimeline> timeline_;
  std::unique_ptr<StepWatchdog> watchdog_;
  bool hooks_ready_ = false;
  size_t marked_ = 0;  // buckets of this step marked on the timeline
  std::vector<OptStep> opt_steps_;
  std::vector<int32_t> chunk_indices_;  // host staging: the chunk's samples
  int64_t chunk_first_ = 0, chunk_end_ = 0;
  int64_t steps_run_ = 0;
  int64_t optimizer_steps_ = 0;
  StepGraph graph_;  // the step, captured at the second and replayed
};

}  // namespace

std::unique_ptr<StageRunner> make_gpu_model_runner(const TrainConfig& config, int replicas) {
  check_gpu_supported(config);
  return std::make_unique<GpuModelRunner>(config, replicas);
}

}  // namespace ddp
