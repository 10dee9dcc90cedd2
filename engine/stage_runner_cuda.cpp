// The GPU runner: CudaStage on the compute stream; activations and gradients to the
// neighbouring stages over NCCL (each direction on its own communicator, so neither queue
// waits behind the other), made to wait for by the stream, never by the host; the step's
// samples and optimizer scalars uploaded before it runs, so that the step itself (gather,
// forwards, backwards, transfers, the data-parallel all-reduces, the optimizer) is captured
// once in a CUDA graph and replayed. The host waits for each step, bounded by --timeout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "engine/ddp.h"
#include "engine/ddp_device.h"
#include "engine/optimizer_overlap.h"
#include "engine/stage_runner.h"
#include "engine/step_watchdog.h"
#include "engine/timeline.h"
#include "models/batch_feeder.h"
#include "models/mlp_stage_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/step_graph.h"

namespace ddp {

namespace {

// Inside a capture, an event recorded as an external node is recorded at every replay.
void record(cudaEvent_t event, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  DDP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone)
    DDP_CUDA_CHECK(cudaEventRecord(event, stream));
  else
    DDP_CUDA_CHECK(cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal));
}

class GpuRunner final : public StageRunner, public ChunkOps {
 public:
  GpuRunner(const StageSpec& spec, const TrainConfig& config, const Dataset& data, StageLinks links,
            Communicator* world, std::function<void()> abort_all)
      : spec_(spec),
        config_(config),
        links_(links),
        stage_(spec.shape, spec.first, spec.end, spec.max_batch, spec.slots, config.optimizer,
               stage_options(config)),
        act_type_(stage_.bf16() ? DataType::kBFloat16 : DataType::kFloat32),
        feeder_(spec.batch, spec.micro_batches, 1, stage_.stream()) {
    // The stages that read the data hold the training split on the device.
    feeder_.set_train_data(data.train, spec.is_first(), spec.is_last());
    act_sent_.resize(spec.slots);
    grad_sent_.resize(spec.slots);
    for (int i = 0; i < 2 * spec.micro_batches; ++i) {
      busy_start_.push_back(std::make_unique<CudaEvent>(true));
      busy_end_.push_back(std::make_unique<CudaEvent>(true));
    }
    busy_what_.resize(busy_start_.size());
    if (config.overlap_optimizer) {
      // One range a layer of this stage, offsets into the stage's own buffers.
      std::vector<ParamSpan> spans;
      for (int i = spec.first; i < spec.end; ++i)
        spans.push_back(
            {spec.shape.layer(i).weight_offset - spec.param_offset(), spec.shape.layer(i).count()});
      overlapped_ = std::make_unique<OptimizerOverlap>(
          stage_.stream(),
          [this](size_t offset, size_t count, cudaStream_t stream) {
            stage_.optimizer_range(offset, count, feeder_.steps(), feeder_.counter(), stream);
          },
          OptimizerOverlap::of_layers(spans), nullptr);
    }
    for (Communicator* c : {links.activations, links.gradients})
      if (c != nullptr) c->set_compute_stream(stage_.stream());
    if (world != nullptr && world->size() > 1)
      watchdog_ = std::make_unique<StepWatchdog>(
          stage_.stream(), config.timeout,
          abort_on_stall(world, std::move(abort_all), config.timeout));
    spdlog::info("stage {}: layers {}-{} on the GPU, {} activation slots; memory: {}", spec.stage,
                 spec.first, spec.end - 1, spec.slots, stage_.memory_report());
  }

  ~GpuRunner() override { cudaStreamSynchronize(stage_.stream()); }

  bool on_gpu() const override { return true; }
  ChunkOps& chunk(int c) override {
    DDP_CHECK(c == 0, "the GPU runner holds one stage, not chunk {}", c);
    return *this;
  }
  float* params() override { return stage_.params(); }
  float* grads() override { return stage_.grads(); }
  void params_changed() override { stage_.refresh_low_precision_params(); }
  void* stream() override { return stage_.stream(); }
  void prepare_ddp(Ddp& ddp, uint64_t fingerprint, const std::string& description) override {
    if (overlapped_ && spec_.stage == 0)
      spdlog::info(
          "--overlap-optimizer: not with data parallelism in a pipeline; one pass after "
          "the gradients are reduced");
    overlapped_.reset();  // the update would have to wait for each bucket's all-reduce
    bf16_grads_ = prepare_device_ddp(ddp, stage_.stream(), fingerprint, description,
                                     config_.grad_reduce == GradReduce::kBf16, spec_.param_count());
  }

  std::vector<float> get_params() override {
    std::vector<float> host(stage_.param_count());
    stage_.get_params(host.data());
    return host;
  }
  void set_params(const float* host) override { stage_.set_params(host); }
  NamedState optimizer_state() override { return stage_.get_optimizer_state(); }
  void set_optimizer_state(const NamedState& state, int64_t steps) override {
    stage_.set_optimizer_state(state);
    optimizer_steps_ = steps;
  }
  int64_t optimizer_steps() const override { return optimizer_steps_; }

  void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                   int steps) override {
    (void)first_step;
    DDP_CHECK(steps == 1, "a GPU pipeline stage takes one step at a time, not {}", steps);
    // The previous step has finished (run_step waits), so the feeder's buffers are free.
    cudaStream_t s = stage_.stream();
    const OptStep scalars = optimizer_scalars(config_.optimizer, lrs[0], optimizer_steps_);
    feeder_.upload_schedule(indices, &scalars, 1);
    busy_marks_ = 0;
    backwards_ = 0;
    // The stream is idle (the previous step was waited for): this event is placed at the
    // host's clock now, and every event of the step is placed from it.
    anchor_us_ = TimelineRecorder::now_us();
    DDP_CUDA_CHECK(cudaEventRecord(anchor_.get(), s));
  }
  void recv_activation(int micro, int slot) override {
    (void)micro;
    wait_for(&act_sent_[slot]);  // the slot's output may still be on its way out
    links_.activations
        ->irecv(stage_.input(slot), count(spec_.in_width()), act_type_, spec_.stage - 1)
        ->then_on(stage_.stream());
  }
  void forward(int micro, int slot) override {
    wait_for(&act_sent_[slot]);
    busy_begin(SpanKind::kForward, micro);
    if (spec_.is_first() || spec_.is_last()) feeder_.feed(stage_, micro, slot);
    stage_.forward(slot, spec_.batch);
    busy_end();
  }
  void send_activation(int micro, int slot) override {
    (void)micro;
    act_sent_[slot] = links_.activations->isend(stage_.output(slot), count(spec_.out_width()),
                                                act_type_, spec_.stage + 1);
  }
  void recv_gradient(int micro, int slot) override {
    (void)micro;
    links_.gradients
        ->irecv(stage_.grad_output(slot), count(spec_.out_width()), act_type_, spec_.stage + 1)
        ->then_on(stage_.stream());
  }
  LossSum loss(int micro, int slot, float grad_scale) override {
    (void)micro;
    stage_.loss(slot, spec_.batch, grad_scale);
    return {};
  }
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override {
    (void)micro;
    wait_for(&grad_sent_[slot]);  // grad_input(slot) of an earlier micro-batch is sent
    busy_begin(SpanKind::kBackward, micro);
    if (++backwards_ == spec_.micro_batches && overlapped_) {
      // The step's last backward: each layer is updated on the side stream as soon as
      // backward no longer reads it (its input gradient, which reads its weights, is enqueued
      // before the next lower layer's hook), beside the layers below.
      overlapped_->begin_step();
      stage_.backward(slot, spec_.batch, accumulate, [&](int local) {
        if (on_layer_done) on_layer_done(local);
        overlapped_->layer_done(local);
      });
      overlapped_->apply_rest();  // joined at the optimizer step, as before
    } else {
      stage_.backward(slot, spec_.batch, accumulate, on_layer_done);
    }
    busy_end();
  }
  void send_gradient(int micro, int slot) override {
    (void)micro;
    grad_sent_[slot] = links_.gradients->isend(stage_.grad_input(slot), count(spec_.in_width()),
                                               act_type_, spec_.stage - 1);
  }
  void end_schedule() override {
    for (auto* sent : {&act_sent_, &grad_sent_})
      for (auto& work : *sent)
        wait_for(&work);
  }
  bool grads_nonfinite() override { return false; }
  void optimizer_step() override {
    // With --overlap-optimizer the updates ran during the last backward: join them.
    if (overlapped_)
      overlapped_->join();
    else
      stage_.optimizer_step(feeder_.steps(), feeder_.counter());
    feeder_.next_step();
    ++optimizer_steps_;
  }
  void run_step(int64_t step, const std::function<void()>& enqueue) override {
    const StepGraph::Ran ran =
        graph_.run(stage_.stream(), config_.cuda_graph && !config_.sync_debug, enqueue);
    if (ran == StepGraph::Ran::kCaptured) {
      captured_marks_ = busy_marks_;
      if (spec_.stage == 0) spdlog::info("pipeline step captured in a CUDA graph");
    } else if (ran == StepGraph::Ran::kReplayed) {
      ++optimizer_steps_;             // the replayed step's optimizer, counted as enqueue() would
      busy_marks_ = captured_marks_;  // its events, recorded again by the replay
    }
    last_step_ = step + 1;
    if (watchdog_) {
      watchdog_->mark(step + 1);
      watchdog_->wait_idle();
    } else {
      DDP_CUDA_CHECK(cudaStreamSynchronize(stage_.stream()));
    }
  }
  void add_device_spans(TimelineRecorder& timeline, int64_t step) override {
    for (int i = 0; i < busy_marks_; ++i)
      timeline.add(busy_what_[i].first, step, busy_what_[i].second, at(*busy_start_[i]),
                   at(*busy_end_[i]));
  }
  double last_busy_s() const override {
    double ms_total = 0;
    for (int i = 0; i < busy_marks_; ++i) {
      float ms = 0;
      DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, busy_start_[i]->get(), busy_end_[i]->get()));
      ms_total += ms;
    }
    return ms_total / 1e3;
  }
  LossSum take_loss() override {
    if (watchdog_) watchdog_->wait_idle();
    return stage_.take_sums(false);
  }
  LossSum evaluate(const Split& split, int64_t begin, int64_t end) override {
    if (&split != eval_split_) {
      eval_.upload(split, spec_.is_first(), spec_.is_last(), stage_.stream());
      eval_split_ = &split;
    }
    cudaStream_t s = stage_.stream();
    const int chunk = spec_.max_batch;
    for (int64_t at = begin; at < end; at += chunk) {
      const int n = static_cast<int>(std::min<int64_t>(chunk, end - at));
      const size_t in = static_cast<size_t>(n) * spec_.in_width();
      if (spec_.is_first())
        stage_.set_input(eval_.x.data() + static_cast<size_t>(at) * split.dim, n, 0);
      else
        links_.activations->irecv(stage_.input(0), in, act_type_, spec_.stage - 1)->then_on(s);
      stage_.forward(0, n);
      if (spec_.is_last())
        stage_.loss(0, n, 0.0f, eval_.y.data() + at, /*evaluation=*/true);
      else
        links_.activations
            ->isend(stage_.output(0), static_cast<size_t>(n) * spec_.out_width(), act_type_,
                    spec_.stage + 1)
            ->then_on(s);
    }
    if (watchdog_) {
      watchdog_->mark(last_step_);
      watchdog_->wait_idle();
    }
    return stage_.take_sums(true);
  }

 private:
  static CudaStageOptions stage_options(const TrainConfig& config) {
    CudaStageOptions options;
    options.precision = config.precision;
    options.fused_epilogues = config.fused_epilogues;
    options.sync_debug = config.sync_debug;
    return options;
  }
  size_t count(int width) const { return static_cast<size_t>(spec_.batch) * width; }
  void wait_for(std::unique_ptr<Work>* work) {
    if (*work) (*work)->then_on(stage_.stream());
    work->reset();
  }
  void busy_begin(SpanKind kind, int micro) {
    busy_what_[busy_marks_] = {kind, micro};
    record(busy_start_[busy_marks_]->get(), stage_.stream());
  }
  double at(const CudaEvent& event) const {
    float ms = 0;
    DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, anchor_.get(), event.get()));
    return anchor_us_ + 1e3 * static_cast<double>(ms);
  }
  void busy_end() { record(busy_end_[busy_marks_++]->get(), stage_.stream()); }

  StageSpec spec_;
  TrainConfig config_;
  StageLinks links_;
  CudaStage stage_;
  DataType act_type_;
  BatchFeeder feeder_;  // the training split, the step's samples and optimizer scalars
  DeviceSplit eval_;    // the split evaluated: features on the first stage, labels on the last
  const Split* eval_split_ = nullptr;
  DeviceBuffer<uint16_t> bf16_grads_;
  std::vector<std::unique_ptr<Work>> act_sent_, grad_sent_;  // by slot, until waited for
  // Each forward and backward of the step between two timed events, and what it was.
  std::vector<std::unique_ptr<CudaEvent>> busy_start_, busy_end_;
  std::vector<std::pair<SpanKind, int>> busy_what_;
  CudaEvent anchor_{true};
  double anchor_us_ = 0;
  int busy_marks_ = 0;      // busy spans recorded this step
  int captured_marks_ = 0;  // and in the captured step
  int64_t last_step_ = 0;
  int64_t optimizer_steps_ = 0;
  int backwards_ = 0;                             // this step's, so far
  std::unique_ptr<OptimizerOverlap> overlapped_;  // --overlap-optimizer without dp
  StepGraph graph_;                               // the step, captured at the second and replayed
  std::unique_ptr<StepWatchdog> watchdog_;
};

}  // namespace

void check_gpu_supported(const TrainConfig& config) {
  DDP_USAGE_CHECK(!config.check_replicas, "--check-replicas: runs on the CPU path only so far");
  DDP_USAGE_CHECK(config.on_nonfinite == OnNonfinite::kStop,
                  "--on-nonfinite {}: runs on the CPU path only so far (the GPU path stops)",
                  on_nonfinite_name(config.on_nonfinite));
  DDP_USAGE_CHECK(!config.recompute, "--recompute: runs on the CPU path only so far");
  DDP_USAGE_CHECK(config.zero == 0, "--zero {}: runs on the CPU path only so far", config.zero);
  DDP_USAGE_CHECK(config.pp == 1 || (!splits_backward(config.schedule) &&
                                     config.schedule != PipelineSchedule::kInterleaved),
                  "--schedule {}: runs on the CPU path only so far (the GPU runners hold one "
                  "stage and compute backward whole); give --device cpu or another --schedule",
                  schedule_name(config.schedule));
}

std::unique_ptr<StageRunner> make_gpu_runner(const StageSpec& spec, const TrainConfig& config,
                                             const Dataset& data, StageLinks links,
                                             Communicator* world, std::function<void()> abort_all) {
  check_gpu_supported(config);
  return std::make_unique<GpuRunner>(spec, config, data, links, world, std::move(abort_all));
}

}  // namespace ddp
